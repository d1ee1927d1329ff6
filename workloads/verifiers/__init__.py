"""Verifiers: a reward in [0, 1] for a completion of a task record, by task type."""

from __future__ import annotations

from collections.abc import Callable

from workloads.verifiers.code import SandboxLimits, run_program, verify_code
from workloads.verifiers.math import last_boxed, verify_math
from workloads.verifiers.records import SYNTHETIC_TYPES, TaskRecord, TaskType
from workloads.verifiers.synthetic import verify_synthetic

VERIFIERS: dict[str, Callable[[TaskRecord, str], float]] = {
    "arithmetic": verify_synthetic,
    "reverse": verify_synthetic,
    "sort": verify_synthetic,
    "math": verify_math,
    "code": verify_code,
}


def score(record: TaskRecord, completion: str) -> float:
    """Task reward of `completion` (decoded text without EOS) for `record`."""
    try:
        verifier = VERIFIERS[record.task_type]
    except KeyError:
        raise ValueError(
            f"no verifier for task type {record.task_type!r}; known: {sorted(VERIFIERS)}"
        ) from None
    return float(verifier(record, completion))


__all__ = [
    "SYNTHETIC_TYPES", "VERIFIERS", "SandboxLimits", "TaskRecord", "TaskType",
    "last_boxed", "run_program", "score", "verify_code", "verify_math", "verify_synthetic",
]  # fmt: skip
