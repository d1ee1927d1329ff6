"""The inference task's settings that a validator judges files by, taken from the task, never from
the file being judged (a file claims its own `max_new_tokens`, temperature and model; a cheater can
rewrite any of them).

A task gives them in `workload.settings` (`{"batch_size": 4}`) or, as before the plug-in seam, in its
`INTELLECT_INFER_*` env vars (`INTELLECT_INFER_BATCH_SIZE=4`), or both when they agree. What the
task leaves unset takes the workload's own defaults. `intellect-validator check --task SPEC.json`
reads the same from a spec file (through the plug-in).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field

from workloads.inference.settings import InferenceSettings

ENV_PREFIX = "INTELLECT_INFER_"


class TaskSettings(BaseModel):
    model: str = "tiny"
    dataset: str = "demo"
    batch_size: int = Field(8, ge=1)
    n: int = Field(4, ge=1)
    max_new_tokens: int = Field(32, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    target_lengths: list[int] = Field(default_factory=lambda: [8], min_length=1)
    length_penalty: float = Field(0.0003, ge=0.0)
    async_level: int = Field(2, ge=0)
    max_prompt_tokens: int = Field(4096, ge=1)
    # The engine the task's workers generate with: its files are judged under the calibration record's
    # part for it on the device each file states (a model calibrated, but not for this backend on that
    # device: recomputation never slashes).
    backend: Literal["torch", "vllm"] = "torch"

    @classmethod
    def defaults(cls) -> TaskSettings:
        """The inference workload's own defaults (what a task that sets nothing runs with)."""
        d = InferenceSettings.model_fields
        return cls(**{name: d[name].default for name in cls.model_fields if name in d})


def parse_env_value(name: str, raw: str) -> Any:
    """An env var's text as the settings model reads it: lists as JSON or comma-separated."""
    if name == "target_lengths" and not raw.strip().startswith("["):
        return [int(x) for x in raw.split(",") if x.strip()]
    if raw.strip().startswith("["):
        return json.loads(raw)
    return raw
