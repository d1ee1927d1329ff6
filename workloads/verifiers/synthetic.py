"""Verifier for the synthetic demo tasks: the completion (up to EOS, whitespace trimmed) must equal
the answer exactly."""

from __future__ import annotations

from workloads.verifiers.records import TaskRecord


def verify_synthetic(record: TaskRecord, completion: str) -> float:
    answer = str(record.verification_info.get("answer", ""))
    if not answer:
        raise ValueError(f"task {record.problem_id}: verification_info needs a non-empty 'answer'")
    return 1.0 if completion.strip() == answer else 0.0
