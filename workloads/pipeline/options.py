"""What a pipeline task can be told, without the model code: the workload's name, the environment prefix
of its settings and the cheats of demos and tests.

The orchestrator imports the pipeline plug-in to check a task when it is POSTed. Importing these from
`member.py` pulled in torch (about 4 s on a quiet 2-core machine, over 10 s on a busy one), so the
first POST of a pipeline task stalled the orchestrator's API that long (seen as a client timeout in
the end-to-end pipeline test). Kept here, the plug-in imports no torch until a judge is built.
"""

from __future__ import annotations

from typing import Literal

WORKLOAD = "pipeline"  # the plug-in's name: the one its calibration records name too
ENV_PREFIX = "INTELLECT_PIPELINE_"

Cheat = Literal["none", "weights", "noise", "noise-unproven", "other-prompt", "skip", "forge-token",
                "wrong-plan", "sign-flip", "negate", "small-flip", "false-accuse", "forge-received",
                "over-keep", "over-draft", "int8", "fp16", "bias", "half-bias", "skip-layer", "frame"]
CHEATS: tuple[str, ...] = (
    "none",
    "weights",
    "noise",
    "noise-unproven",
    "other-prompt",
    "skip",
    "forge-token",
    "wrong-plan",  # stage 0 as a task (workload.py): seeds the task's plan does not derive
    "sign-flip",  # forwarders: see cheats.py
    "negate",
    "small-flip",
    "false-accuse",  # receivers: see cheats.py
    "forge-received",
    "over-keep",  # drivers with a draft: see cheats.py
    "over-draft",
    "int8",  # compute savers (issue 55): see cheats.py
    "fp16",
    "bias",
    "half-bias",
    "skip-layer",
    "frame",  # wherever it sits: `noise` when it forwards, `forge-token` at the last stage (workload.py)
)
