"""What a pipeline task is told, in two places: the trainer's part (`PipelineSettings`, the task's
`workload.settings`), which the orchestrator checks when the task is POSTed and validators judge files
by, and what one member reads from its environment when its worker runs it (`PipelineTaskSettings`:
those settings as `INTELLECT_PIPELINE_*` variables, plus the group's place the worker fills in from the
task's templates). The plug-in (`plugin.py`) renders the first into the second.

Kept apart from the program and the judge so that the plug-in, which the orchestrator imports to
check a POSTed task, imports no model code (`options.py` says why that matters).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import SettingsConfigDict

from intellect.settings import IntellectSettings
from workloads.pipeline.draft import check_draft
from workloads.pipeline.options import CHEATS, ENV_PREFIX


class PipelineSettings(BaseModel):
    """`workload.settings` of a pipeline task (the trainer's part; the group's comes from the worker)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("tiny", max_length=500)
    dataset: str = Field("reverse", max_length=500)
    batch_size: int = Field(8, ge=1, le=256)
    n: int = Field(1, ge=1, le=64, description="completions per prompt (GRPO group size)")
    batches: int = Field(4, ge=1, le=100_000)
    max_new_tokens: int = Field(32, ge=1, le=4096)
    temperature: float = Field(1.0, gt=0, le=10)
    target_lengths: list[int] = Field([8], min_length=1, max_length=64)
    length_penalty: float = Field(0.0, ge=0)
    timeout_seconds: float = Field(60.0, gt=0, le=3600)
    in_flight: int = Field(1, ge=1, le=64, description="batches the group keeps moving at once (slow links)")
    draft: str = Field("none", max_length=500, pattern=r"^(none|prompt-lookup|model:.+)$",
                       description="the driver's guesses the group checks in one trip (exact: the same "
                       "files as without): none, prompt-lookup or model:<name or folder>")
    draft_tokens: int = Field(4, ge=0, le=15)
    # Following a trainer (an RL run): see `PipelineTaskSettings` below and policy.py.
    step_url: str | None = Field(None, max_length=2000)
    checkpoint_source: str | None = Field(None, max_length=4000)
    async_level: int = Field(2, ge=0, le=64)
    poll_seconds: float = Field(2.0, gt=0, le=600)
    files_per_step: int = Field(0, ge=0, le=100_000)
    step_patience_seconds: float = Field(20.0, gt=0, le=3600)
    cheat: str = Field("none", description="demos and tests only")
    cheat_stage: int = Field(-1, ge=-1, le=63)

    @model_validator(mode="after")
    def _follow_both(self) -> PipelineSettings:
        # A driver following the trainer's step with no checkpoints would name the base model for every
        # step: outside the async window as soon as the trainer moves, so no member would ever write.
        if bool(self.step_url) != bool(self.checkpoint_source):
            raise ValueError("step_url and checkpoint_source go together (following a trainer needs both)")
        if self.files_per_step and self.step_patience_seconds >= self.timeout_seconds:
            raise ValueError("step_patience_seconds must stay below timeout_seconds (the members wait for "
                             "the driver)")  # fmt: skip
        return self


class PipelineTaskSettings(IntellectSettings):
    """What a member reads from its task's environment."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    model: str = Field("tiny", description="the model split across the group ('tiny': the shipped one)")
    dataset: str = Field("reverse", description="shipped set name or a .jsonl/.parquet path")
    batch_size: int = Field(8, ge=1, le=256, description="prompts per batch (file)")
    n: int = Field(1, ge=1, le=64, description="completions per prompt (GRPO group size)")
    batches: int = Field(4, ge=1, le=100_000, description="batches the group makes, then the task ends")
    max_new_tokens: int = Field(32, ge=1, le=4096)
    temperature: float = Field(1.0, gt=0, le=10)
    target_lengths: list[int] = Field([8], min_length=1, description="target output lengths to draw from")
    length_penalty: float = Field(0.0, ge=0, description="reward -= this × |len - target|")
    # Following a trainer (an RL run), as the single-node inference workload does: the driver reads the
    # trainer's step, picks the newest checkpoint within the async level, and every member loads that
    # checkpoint's layers. Unset: step 0 and the shipped weights for every batch.
    step_url: str | None = Field(None, description="trainer step-counter URL returning {'step': int}")
    checkpoint_source: str | None = Field(None, description="as INTELLECT_INFER_CHECKPOINT_SOURCE")
    async_level: int = Field(2, ge=0, le=64)
    poll_seconds: float = Field(2.0, gt=0)
    files_per_step: int = Field(0, ge=0, description="the driver waits after this many batches of one "
                                "trainer step until the step moves (0: no cap)")
    step_patience_seconds: float = Field(20.0, gt=0, description="…but no longer than this, then one more "
                                         "batch (must stay below timeout_seconds: the members wait too)")
    checkpoint_cache: Path = Path(".checkpoints")
    timeout_seconds: float = Field(60.0, gt=0, description="how long a peer may stay silent")
    draft: str = Field("none", description="stage 0: the draft whose guesses the group checks a trip at a "
                       "time (none, prompt-lookup, model:<name or folder>); the files are those of plain "
                       "decoding")
    draft_tokens: int = Field(4, ge=0, le=15, description="stage 0: tokens guessed a trip")
    in_flight: int = Field(1, ge=1, le=64, description="batches the driver keeps moving at once: over slow "
                           "links the members work on one while another's frames cross the wire")
    cheat: str = Field("none", description="demos and tests only: the cheat of the member at cheat_stage")
    cheat_stage: int = Field(-1, ge=-1, description="the stage that cheats (-1: whichever this member "
                             "holds: the demo's cheating operator sets the cheat on its own worker)")

    # Filled by the worker from the task's template variables (runtime-owned, never the trainer's).
    group_id: str = ""
    group_index: int = Field(0, ge=0)
    group_size: int = Field(1, ge=1, le=64)
    member_secret: str = Field("", repr=False)  # this member's own transport secret (hex)
    group_keys: str = ""  # every member's transport public key (hex), comma-separated, in stage order
    # every member's node address, comma-separated, stage order (${GROUP_MEMBERS}: the orchestrator's word;
    # unset from an orchestrator that names none: the hello round alone says who is who)
    group_members: str = ""
    next_address: str = ""
    # How the two links open (${P2P_INBOX}, ${P2P_OUTBOX}): "listen" on this worker's port (the inbox on
    # P2P_PORT, the outbox on P2P_PORT + 1 for a next member behind NAT), or an address to dial.
    # Unset (an orchestrator that predates NAT groups): the inbox listens, the outbox dials next_address.
    inbox: str = "listen"
    outbox: str = ""
    p2p_port: int = Field(0, ge=0, le=65535)
    node_address: str = ""
    task_id: str = ""
    output_dir: Path = Path("pipeline")

    @model_validator(mode="after")
    def _check(self) -> PipelineTaskSettings:
        check_draft(self.draft)
        if self.cheat not in CHEATS:
            raise ValueError(f"cheat {self.cheat!r}: one of {', '.join(CHEATS)}")
        if not self.group_index < self.group_size:
            raise ValueError(f"group_index {self.group_index} is not in a group of {self.group_size}")
        if self.files_per_step and self.step_patience_seconds >= self.timeout_seconds:
            raise ValueError(f"step_patience_seconds {self.step_patience_seconds} must stay below "
                             f"timeout_seconds {self.timeout_seconds} (the members wait for the driver)")
        data_dir = os.environ.get("INTELLECT_DATA_DIR")
        if data_dir and not self.output_dir.is_absolute():
            self.output_dir = Path(data_dir) / self.output_dir
        if data_dir and not self.checkpoint_cache.is_absolute():
            self.checkpoint_cache = Path(data_dir) / self.checkpoint_cache
        return self
