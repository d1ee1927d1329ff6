"""How a pipeline member's file is judged: the plug-in's judge (`file_judge.py`, the `FileJudge` a
validator builds per task), the batch end to end for pay (`end_to_end.py`: one prefill, every stage's
proofs and the tokens), each member locally for blame from its own evidence (`replay.py`, with the
frames its seals cover read against the batch in `sealed.py` and the forward limits of `tolerance.py`),
and a member's recent files pooled per stage (`pooled.py`).

The validator hosts this judge through the workload seam (`intellect.workloads`: the plug-in's
`file_judge`) and imports nothing of it. The making side uses it too: a member judges its own file
before writing it (`selfcheck.py`), and `tolerance_calibration.py` derives the limits from honest
groups; nothing here imports the members' protocol (`member.py`, `group.py`), so the judge stays what
a validator runs."""
