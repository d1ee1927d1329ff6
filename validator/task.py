"""What the checks take from the task spec and the pool's policy, never from the file being judged.

A file claims its own `max_new_tokens`, temperature and model; a cheater can rewrite any of them.
So the checks compare the file against these settings: in `run` from the task the orchestrator
serves (its `INTELLECT_INFER_*` env vars), in `check` from `--task SPEC.json`, and by default the
inference workload's own defaults.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

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

    @classmethod
    def defaults(cls) -> TaskSettings:
        """The inference workload's own defaults (what a task that sets nothing runs with)."""
        d = InferenceSettings.model_fields
        return cls(**{name: d[name].default for name in cls.model_fields if name in d})

    @classmethod
    def from_env(cls, env: dict[str, str]) -> TaskSettings:
        """From a task spec's env vars (`INTELLECT_INFER_MAX_NEW_TOKENS=64`, ...); unset ones default."""
        values: dict[str, object] = cls.defaults().model_dump()
        for name in cls.model_fields:
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is None:
                continue
            if name == "target_lengths":
                values[name] = (
                    json.loads(raw) if raw.strip().startswith("[") else [int(x) for x in raw.split(",")]
                )
            else:
                values[name] = raw
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise ValueError(f"the task's inference settings are invalid: {exc}") from None

    @classmethod
    def from_spec_file(cls, path: Path) -> TaskSettings:
        """A task spec JSON as POSTed to the orchestrator (its `env_vars`), or a bare settings object."""
        try:
            body = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"--task {path}: not a readable JSON file ({exc})") from None
        if isinstance(body, dict) and "env_vars" in body:
            return cls.from_env({str(k): str(v) for k, v in (body.get("env_vars") or {}).items()})
        try:
            return cls.model_validate(body)
        except ValidationError as exc:
            raise ValueError(f"--task {path}: {exc}") from None
