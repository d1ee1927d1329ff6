"""Everything the checks of one file share: the file, its submission, the task and the tools."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from intellect.wire.verdicts import Submission
from intellect.workloads import CheckpointSource, SeenStore
from workloads.inference.judge.thresholds import ValidationThresholds
from workloads.inference.task import TaskSettings
from workloads.rollouts import BatchInfo, Rollout
from workloads.verifiers.records import TaskRecord


@dataclass
class FileContext:
    path: Path
    submission: Submission
    task: TaskSettings
    thresholds: ValidationThresholds
    records: list[TaskRecord]
    tokenizer: PreTrainedTokenizerBase
    seen: SeenStore
    checkpoints: CheckpointSource
    vocab_size: int
    task_id: str = ""  # the task the file was uploaded for, "" when not known
    sha256: str = ""
    size: int = 0
    rows: list[Rollout] = field(default_factory=list)
    info: BatchInfo | None = None
    row_hashes: list[str] = field(default_factory=list)
    plan_key: str = ""

    @property
    def tokens(self) -> int:
        return sum(len(r.output_tokens) for r in self.rows)


def rows_named(rows: list[int], limit: int = 5) -> str:
    """`rows 1, 4, 9 (+3 more)`: which rows a reason is about, briefly."""
    shown = ", ".join(str(r) for r in rows[:limit])
    more = f" (+{len(rows) - limit} more)" if len(rows) > limit else ""
    return f"row{'s' if len(rows) != 1 else ''} {shown}{more}"
