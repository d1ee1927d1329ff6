"""Math verifier: the final \\boxed{...} answer of the completion, compared for mathematical
equivalence with the reference answer through `math-verify` (sympy underneath)."""

from __future__ import annotations

import threading

import structlog

from workloads.verifiers.records import TaskRecord

log = structlog.get_logger(__name__)


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


MAX_ANSWER_CHARS = 512  # longer "answers" are wrong; also bounds sympy's work without a timeout


def equivalent(answer: str, reference: str) -> bool:
    if answer.strip() == reference.strip():
        return True
    if len(answer) > MAX_ANSWER_CHARS:
        return False
    try:
        from math_verify import parse, verify  # noqa: PLC0415 - heavy import, only when needed

        # math-verify's timeouts use SIGALRM, which only works in the main thread; elsewhere (a
        # thread pool) run without them rather than fail every answer.
        timeout = 5 if threading.current_thread() is threading.main_thread() else None
        gold = parse(f"${reference}$", parsing_timeout=timeout)
        pred = parse(f"${answer}$", parsing_timeout=timeout)
        return bool(gold and pred and verify(gold, pred, timeout_seconds=timeout))
    except Exception as exc:  # a malformed answer is wrong, not a crash of the workload
        log.debug("math-verify failed", answer=answer, reference=reference, error=str(exc))
        return False


def verify_math(record: TaskRecord, completion: str) -> float:
    reference = record.verification_info.get("answer")
    if reference is None:
        raise ValueError(f"task {record.problem_id}: math verification_info needs 'answer'")
    boxed = last_boxed(completion)
    return 1.0 if boxed is not None and equivalent(boxed, str(reference)) else 0.0
