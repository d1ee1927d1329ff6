"""What a validator decides about one submitted file, and what it needs to know about the
submission that is not in the file itself. Shared by the checks pipeline (`validator/pipeline.py`)
and the service (watcher, store, API), so both speak one language."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from intellect.wire.verdicts import Submission, Verdict, VerdictKind
from intellect.workloads import SeenStore

__all__ = ["CheckpointSource", "Judge", "SeenStore", "Submission", "Verdict", "VerdictKind"]


class Judge(Protocol):
    """Anything that turns a downloaded file plus its submission into a verdict."""

    def judge(self, path: Path, submission: Submission) -> Verdict: ...


class CheckpointSource(Protocol):
    """Where the model a file claims to come from is found: the local safetensors file and its
    sha256 for a trainer step (0 = the base model), or None when that step is unknown."""

    def checkpoint_for(self, step: int) -> tuple[Path, str] | None: ...
