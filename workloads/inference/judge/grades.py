"""How much evidence a failed recomputation is: the grade that decides between "not paid" and "slash".

Every check but the recomputation (check 8) is exact: a schema, a plan, a reward, a duplicate is
right or wrong whatever machine judges it, so its failure is the node's deed and slashes. The
recomputation compares what the node's generation computed with what the validator's prefill
computes, two bf16 computations that never agree exactly; its limits sit above the worst honest value
measured, but honest noise has a tail (a near tie, a busy machine, another kernel), and one honest
row past a limit took an honest node's stake (issue 37). So its findings are graded:

- **strong**: what no honest noise makes. Rows of the file failing recomputed rules: at least
  `strong_rows` (3) of them (honest failures are single rare events: one row in thousands); or one
  row failing far past anything honest (a Gumbel gap or a token's logprob error `row_far_factor` (10)
  times its limit; a TOPLOC chunk with twice the limit's exponent mismatches or 1.5 times its mantissa
  mean: a proof of other hidden states), seen again alone at another prefill batch; or a
  file-level statistic (TOPLOC fingerprint, logprob bias, outlier tokens; each over at least a
  file's worth of tokens) at `file_strong_factor` (1.25) times its limit or more; or an exact rule
  found while recomputing (tokens after EOS, an output cut short). → `invalidate` (slash).
- **marginal**: anything less (one or two rows, a statistic just past its limit). Looked at again
  before anyone is slashed: the failing rows are recomputed alone (prefill batch 1, another batch
  shape and padding than the first pass); a failure that does not repeat is no evidence and the
  file is judged as if it had passed. One that repeats makes the file `soft_invalidate` (not paid,
  not slashed) and leaves a mark in the node's window of recent files; the node's
  `marginal_files`-th (4th) marked file among its last `pool_files` (16) is `invalidate`: a cheat that
  stays just past the limits is never paid and, repeated, slashed, while honest noise (about one file
  in 500 at the per-row rate assumed in docs/validator.md "Grades") would need four in sixteen.

A failure of the validator's own (a memory limit, a dead reader, a timeout, storage unreachable) never
reaches this grading: it is retried, and after the poison limit soft-invalidated (validator/judging.py).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from workloads.inference.judge.thresholds import ValidationThresholds

Grade = Literal["none", "marginal", "strong"]


class Finding(BaseModel):
    """One failed recomputation rule: the reason a user reads, and what grades it."""

    rule: str
    reason: str
    rows: list[int] = Field(default_factory=list, description="rows of the file it fails (row rules)")
    excess: float = Field(0.0, description="file statistics: the value over its limit (1.0 = at the limit)")
    exact: bool = Field(False, description="a rule no rounding can break (tokens after EOS, cut short)")
    far_rows: list[int] = Field(
        default_factory=list, description="rows failing far past anything honest (row_far_factor, "
        "toploc_far_mismatches): strong evidence one row at a time",
    )


def grade(findings: list[Finding], th: ValidationThresholds) -> Grade:
    """The grade of one file's findings (see the module's docstring)."""
    if not findings:
        return "none"
    if any(f.exact for f in findings):
        return "strong"
    rows = {r for f in findings for r in f.rows}
    if len(rows) >= th.strong_rows:
        return "strong"
    if any(not f.rows and f.excess >= th.file_strong_factor for f in findings):
        return "strong"
    if any(f.far_rows for f in findings):
        return "strong"
    return "marginal"


def strong_by_far_rows_alone(findings: list[Finding], th: ValidationThresholds) -> bool:
    """Strong only because of far rows: those few rows are looked at again before anyone is slashed."""
    rest = [f.model_copy(update={"far_rows": []}) for f in findings]
    return grade(findings, th) == "strong" and grade(rest, th) != "strong"


def marked_files(window: list[dict[str, Any]]) -> int:
    """Marginal files among a node's window entries, each file once (a file judged again after an
    error of the validator's is in the window twice)."""
    marked = {str(e.get("file") or i) for i, e in enumerate(window) if e.get("marginal")}
    return len(marked)


CLOSED = "closed"  # a window entry: the node's file of that sha256 was judged `invalidate`


def open_window(window: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries after the node's last `invalidate` (issue 54: a caught cheat's statistics once kept
    failing the node's honest files after it, pooled). Each slash rests on its own evidence."""
    last = max((i for i, e in enumerate(window) if e.get(CLOSED)), default=-1)
    return window[last + 1 :]


def window_named(window: list[dict[str, Any]], shown: int = 16) -> str:
    """What a node's window holds, for a reason: `the node's 3 files since its last slash or the
    window's start (sha256 1a2b3c4d, …)`."""
    names = ", ".join(str(e.get("file") or "?")[:8] for e in window[:shown])
    return f"the node's {len(window)} file{'s' if len(window) != 1 else ''} in its window ({names})"


def unique_files(window: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A node's window with each file once (its last entry): pooled sums count a file once."""
    last: dict[str, dict[str, Any]] = {}
    for i, entry in enumerate(window):
        last.pop(str(entry.get("file") or i), None)
        last[str(entry.get("file") or i)] = entry
    return list(last.values())
