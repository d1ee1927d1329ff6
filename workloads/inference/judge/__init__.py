"""How an inference rollout file is judged: the checks in order (`file_judge.py`, checks cheapest first in
`checks/`), its limits (`thresholds.py`, per model from `calibrations/` by `calibrate.py`), how much
evidence a failed recomputation is (`grades.py`), and the memory-capped reader (`reader.py`).

The validator hosts this judge through the workload seam (`intellect.workloads`: the plug-in's
`file_judge`) and imports nothing of it; the judge gets what it needs from its host (the seen-store,
node windows, the trainer's checkpoints by step) in a `ValidatorEnv`."""
