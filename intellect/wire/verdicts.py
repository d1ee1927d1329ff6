"""What a validator decides about one submitted file, and what it knows of the submission that is not
in the file. Shared by the validator and by every workload plug-in's checks (`intellect.workloads`),
so that a plug-in written outside this project speaks the same language as the validator."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

VerdictKind = Literal["accept", "soft_invalidate", "invalidate"]


class Submission(BaseModel):
    """Facts about a submission that come from the chain, the trainer and the task (in `run`), or from
    CLI flags (in `check`). `None` means "unknown": the checks that need it then use the file's own
    claims, which they verify, never trust."""

    node: str | None = None  # checksummed node address that submitted the work
    pool_id: int | None = None
    work_key: str | None = None  # 0x + 64 hex: sha256 of the file as recorded on chain
    work_units: int | None = None  # units claimed on chain
    # The trainer's step when the work was submitted: the latest it may have been (the step when the
    # validator read the submission, judging 'ahead of the trainer') and the earliest (the step in force
    # at the block's time less a clock grace, judging 'behind its window': the same for a validator
    # that reads the chain late or restarts).
    trainer_step: int | None = None
    trainer_step_before: int | None = None  # None: as trainer_step
    block_number: int | None = None
    tx_hash: str | None = None
    # The node's files just before this one that the validator never read (storage unreachable until
    # the deadline): their batch counters are unknown, so as many counters may have been skipped.
    counters_unknown: int = 0


class JudgedBy(BaseModel):
    """Which limits judged a file: a calibration record made on the task's model (the only source that
    lets a measured rule slash), or none ("uncalibrated": what the recomputation finds is at most not
    paid, never slashed), and the settings the pool set explicitly on top."""

    source: Literal["record", "uncalibrated"]
    record: str = Field("", description="the record's name (the model it was made on)")
    model_id: str = Field("", description="the model's content address, as the record names it")
    overrides: dict[str, float | int] = Field(
        default_factory=dict, description="limits the pool set explicitly (INTELLECT_VALIDATOR_*)"
    )
    backend: str = Field("torch", description="the generating backend the task names (the record's part)")
    device: str = Field(
        "cpu", description="the device the file says it was generated on (with the backend: the part that "
        "judged its pay; verdicts from before the field read as cpu, the device every part then had)",
    )

    def label(self) -> str:
        base = f"record {self.record} ({self.model_id[:12]})" if self.source == "record" else "uncalibrated"
        part = self.backend if self.device == "cpu" else f"{self.backend}@{self.device}"
        if part != "torch":
            base += f", {part} part" if self.source == "record" else f" for backend {part}"
        extra = ", ".join(f"{k}={v}" for k, v in sorted(self.overrides.items()))
        return f"{base}; pool overrides: {extra}" if extra else base


class Verdict(BaseModel):
    """accept: pay it. soft_invalidate: do not pay, do not slash (the fault may not be the node's).
    invalidate: the node cheated or broke its task's rules: slash (by the pool's quorum)."""

    file: str
    verdict: VerdictKind
    reasons: list[str] = Field(default_factory=list)  # empty for accept
    rows: int = 0
    tokens: int = 0  # output tokens (work units) in the file
    step: int | None = None  # the file's trainer step, when it has one and it could be read
    seconds: float = 0.0
    timings: dict[str, float] = Field(default_factory=dict)  # check name -> seconds
    judged_by: JudgedBy | None = None  # the limits that judged it, where its workload has such limits
