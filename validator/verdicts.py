"""What a validator decides about one submitted file, and what it needs to know about the
submission that is not in the file itself. Shared by the checks pipeline (`validator/pipeline.py`)
and the service (watcher, store, API), so both speak one language."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, Field

VerdictKind = Literal["accept", "soft_invalidate", "invalidate"]


class Submission(BaseModel):
    """Facts about a submission that come from the chain, the trainer and the task spec (in
    `run`), or from CLI flags (in `check`). `None` means "unknown": the checks that need it then
    use the file's own claims, which they verify, never trust."""

    node: str | None = None  # checksummed node address that submitted the work
    pool_id: int | None = None
    work_key: str | None = None  # 0x + 64 hex: sha256 of the file as recorded on chain
    work_units: int | None = None  # units claimed on chain
    trainer_step: int | None = None  # the trainer's step when the work was submitted
    block_number: int | None = None
    tx_hash: str | None = None


class Verdict(BaseModel):
    file: str
    verdict: VerdictKind
    reasons: list[str] = Field(default_factory=list)  # empty for accept
    rows: int = 0
    tokens: int = 0  # output tokens in the file
    step: int | None = None  # the file's step, when it could be read
    seconds: float = 0.0
    timings: dict[str, float] = Field(default_factory=dict)  # check name -> seconds


class Judge(Protocol):
    """Anything that turns a downloaded file plus its submission into a verdict."""

    def judge(self, path: Path, submission: Submission) -> Verdict: ...


class SeenStore(Protocol):
    """Remembers, per pool, every judged file's sha256 and the hash of each of its rows
    (sha256 of prompt tokens + output tokens + seed), so a file or a row is never paid twice.
    In `check`: in memory across the files given; in `run`: SQL (the service's store)."""

    def file_seen(self, pool_id: int | None, sha256: str) -> bool: ...

    def rows_seen(self, pool_id: int | None, row_hashes: list[str]) -> set[str]: ...

    def remember(self, pool_id: int | None, sha256: str, row_hashes: list[str]) -> None: ...


class CheckpointSource(Protocol):
    """Where the model a file claims to come from is found: the local safetensors file and its
    sha256 for a trainer step (0 = the base model), or None when that step is unknown."""

    def checkpoint_for(self, step: int) -> tuple[Path, str] | None: ...
