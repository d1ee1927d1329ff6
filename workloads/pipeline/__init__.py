"""Pipeline-parallel group inference: a model split across a group's members, one stage each,
activations streamed member to member, each stage's output committed to by TOPLOC proofs so a
validator accepts the group with one prefill and, on a failure, blames the member at fault.

Made here, judged in `judge/` (the shape of `workloads/inference/`; docs/workloads.md has the map):
- the program, `__main__.py`: `task` as a worker runs it (`workload.py`, settings in `settings.py`),
  or by flags (`standalone.py`, what `group.py` starts for local groups);
- the plug-in (`plugin.py`, `options.py`): a task's settings checked and rendered for the workers;
- a member (`member.py`) and what it is made of: the batch (`bundle.py`), the model's stages
  (`stages.py`), the links (`transport.py`, `inbound.py`), signed link records (`commit.py`,
  `seals.py`), batches in flight (`flight.py`), drafts and trips (`draft.py`, `trips.py`), row
  positions (`positions.py`), the batch's weights (`policy.py`), its own file judged before it is
  written (`selfcheck.py`), the file (`files.py`);
- a whole group on one machine (`group.py`: processes or threads), and what runs groups to measure the
  judge: a model's forward limits for its calibration record (`tolerance_calibration.py`, run by
  `intellect-validator calibrate --pipeline`), the cheats and the fuzzer of tests, benches and demos
  (`cheats.py`, `adversary.py`).
"""
