"""Math verifier: the final \\boxed{...} answer of the completion, compared for mathematical
equivalence with the reference answer through `math-verify` (sympy underneath)."""

from __future__ import annotations

import logging

from workloads.verifiers.records import TaskRecord

log = logging.getLogger(__name__)


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces balanced; None if there is none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i : j - 1] if depth == 0 else None


def equivalent(answer: str, reference: str) -> bool:
    if answer.strip() == reference.strip():
        return True
    try:
        from math_verify import parse, verify  # noqa: PLC0415 - heavy import, only when needed

        gold = parse(f"${reference}$")
        pred = parse(f"${answer}$")
        return bool(gold and pred and verify(gold, pred))
    except Exception as exc:  # a malformed answer is wrong, not a crash of the workload
        log.debug("math-verify failed on %r vs %r: %s", answer, reference, exc)
        return False


def verify_math(record: TaskRecord, completion: str) -> float:
    reference = record.verification_info.get("answer")
    if reference is None:
        raise ValueError(f"task {record.problem_id}: math verification_info needs 'answer'")
    boxed = last_boxed(completion)
    return 1.0 if boxed is not None and equivalent(boxed, str(reference)) else 0.0
