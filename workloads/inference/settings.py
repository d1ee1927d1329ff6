"""Settings of the inference workload: flags override `INTELLECT_INFER_*` environment variables,
which override `.env`, then these defaults."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from intellect.device import DEVICE_DESCRIPTION, check_device_setting
from intellect.settings import IntellectSettings


class InferenceSettings(IntellectSettings):
    model_config = SettingsConfigDict(
        env_prefix="INTELLECT_INFER_",
        env_file=".env",
        extra="ignore",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_prog_name="intellect-infer",
    )

    model: str = Field("tiny", description="model name (hub) or path; 'tiny' is the shipped model")
    dataset: str = Field(
        "demo", description="shipped set name (demo, reverse, math, code) or a .jsonl/.parquet path"
    )
    node_address: str = Field(
        "0x0000000000000000000000000000000000000001",
        description="this node's address (seeds the data sampling)",
    )
    output_dir: Path = Field(Path("rollouts"), description="where rollout files are written")
    batch_size: int = Field(8, ge=1, description="prompts per batch (file)")
    n: int = Field(4, ge=1, description="completions per prompt (GRPO group size)")
    max_new_tokens: int = Field(32, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    target_lengths: list[int] = Field([8], min_length=1, description="target output lengths to draw from")
    length_penalty: float = Field(0.0003, ge=0.0, description="reward -= this × |len - target|")
    step_url: str | None = Field(None, description="trainer step-counter URL returning {'step': int}")
    step: int = Field(0, ge=0, description="fixed step when no step_url is configured")
    poll_seconds: float = Field(2.0, gt=0)
    checkpoint_source: str | None = Field(
        None, description="checkpoint file per step: a path or URL with {step} (sha256 in '<file>.sha256'), "
        "or 'broadcast:URL[,URL…]' of broadcast relays",
    )
    checkpoint_cache: Path = Field(Path(".checkpoints"), description="local copies of fetched checkpoints")
    async_level: int = Field(2, ge=0, description="rollouts may come from a policy this many steps old")
    max_batches: int = Field(0, ge=0, description="stop after this many files; 0 runs forever")
    files_per_step: int = Field(
        0, ge=0, description="pause after this many files for one step until the trainer moves on (0: no "
        "cap); keeps a pool from producing far more than its validators can judge or its trainer use",
    )
    step_patience_seconds: float = Field(
        30.0, gt=0, description="with files_per_step: if the step has not moved after this long, write one "
        "more file (the trainer may still lack informative rows), then wait again",
    )
    proofs: bool = Field(True, description="build TOPLOC proofs")
    device: str = Field("auto", description=DEVICE_DESCRIPTION)
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="weights' dtype; validators recompute in bfloat16, so keep it"
    )
    backend: Literal["torch", "vllm"] = Field(
        "torch", description="the engine that generates: torch (the project's decoder, everywhere) or vllm "
        "(vLLM's V1 engine, GPU or CPU build; its own install: `make vllm`). Validators judge files by the "
        "task's backend and the device each file states it was made on (the calibration record's part)",
    )
    json_output: bool = Field(False, description="print one JSON line per batch instead of a table row")
    cheat: Literal["none", "forged-reward", "perturbed-model", "inflated-units"] = Field(
        "none", description="demos and tests only: write dishonest files the validators must catch"
    )

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        return check_device_setting(value)

    @model_validator(mode="after")
    def _check(self) -> InferenceSettings:
        try:
            int(self.node_address, 16)
        except ValueError:
            raise ValueError(f"node_address {self.node_address!r} is not a hex address") from None
        # Inside a worker's task, relative folders live in the task's data dir (`/data` in a container),
        # the only place the bridge uploads from, whatever the image's working directory is.
        data_dir = os.environ.get("INTELLECT_DATA_DIR")
        if data_dir:
            if not self.output_dir.is_absolute():
                self.output_dir = Path(data_dir) / self.output_dir
            if not self.checkpoint_cache.is_absolute():
                self.checkpoint_cache = Path(data_dir) / self.checkpoint_cache
        return self
