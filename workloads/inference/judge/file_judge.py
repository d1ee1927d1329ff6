"""The validation pipeline: one rollout file + its submission → a verdict with reasons.

Checks run cheapest first (docs/validator.md): 1 identity → 2 schema and bounds → 3 work units →
4 duplicates → 5 plan derivation → 6 freshness → 7 rewards → 8 recompute (prefill: termination,
sampling, logprobs, TOPLOC). A failure of 1 is `soft_invalidate` (no slash: storage may be at
fault); any failure of 2–7 is `invalidate`; a failure of 8 is graded by its evidence
(workloads/inference/judge/grades.py): strong → `invalidate`, marginal → looked at again, then
`soft_invalidate`
(the node's fourth marginal file in its window: `invalidate`). The recompute runs only when 2–7
passed: a file that already failed needs no forward pass to be rejected.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import structlog
import torch
from transformers import PreTrainedModel

from intellect.device import model_dtype, resolve_device
from intellect.wire.verdicts import Submission, Verdict, VerdictKind
from intellect.workloads import (
    DEFAULT_MAX_FILE_BYTES,
    CheckpointSource,
    MemoryNodeWindows,
    NodeWindows,
    SeenStore,
)
from workloads.datasets import load_dataset
from workloads.inference.judge.calibration import CalibrationRecord, Limits, resolve_limits
from workloads.inference.judge.checks.basic import file_identity, schema_and_bounds, work_units
from workloads.inference.judge.checks.context import FileContext, rows_named
from workloads.inference.judge.checks.history import (
    counter_order,
    duplicates,
    forfeit,
    freshness,
    plan_derivation,
    unverifiable_freshness,
)
from workloads.inference.judge.checks.model import FAR, FileStats, distribution_findings, pooled, recompute
from workloads.inference.judge.checks.rewards import rewards_and_advantages
from workloads.inference.judge.grades import (
    CLOSED,
    Finding,
    grade,
    marked_files,
    open_window,
    strong_by_far_rows_alone,
    unique_files,
    window_named,
)
from workloads.inference.judge.reader import CappedReader, shared_reader
from workloads.inference.task import TaskSettings
from workloads.model.loading import load_model, load_tokenizer, load_weights
from workloads.rollouts import Rollout

log = structlog.get_logger(__name__)
T = TypeVar("T")


class InferenceJudge:
    """The inference workload's `Judge`: one rollout file through the checks above, cheapest first, to
    a verdict. Thread-compatible, not thread-safe: give each validation thread its own."""

    def __init__(
        self,
        task: TaskSettings,
        seen: SeenStore,
        checkpoints: CheckpointSource,
        limits: Limits | None = None,
        *,
        max_bytes: int = DEFAULT_MAX_FILE_BYTES,
        models_kept: int = 3,
        windows: NodeWindows | None = None,
        task_id: str = "",
        reader: CappedReader | None = None,
        device: str | torch.device = "auto",
    ) -> None:
        self.task = task
        self.device = resolve_device(device)  # refused before any model loads: CUDA asked, none here
        self.reader = reader or shared_reader()
        self.task_id = task_id  # the task these files were uploaded for ("" = not known: not bound)
        self.seen = seen
        self.checkpoints = checkpoints
        # The one place limits come from (calibration.resolve_limits): the record made on the task's
        # model, the pool's explicit settings on top; without a record, recomputation failures are
        # never slashed.
        self.limits = limits or resolve_limits(task.model, backend=task.backend)
        # The record, where it calibrates the task's model AND its generating backend (issue 57).
        self.calibration: CalibrationRecord | None = self.limits.record if self.limits.calibrated() else None
        self.thresholds = self.limits.thresholds
        if self.calibration is None:
            log.warning(
                "no calibration for the task's model and backend: recomputation failures are not paid, "
                "never slashed", model=task.model, backend=task.backend, model_id=self.limits.model_id,
                why=self.limits.uncalibrated_reason(task.model),
            )  # fmt: skip
        self.max_bytes = max_bytes
        self.windows: NodeWindows = windows or MemoryNodeWindows()
        self.records = load_dataset(task.dataset)
        self.tokenizer = load_tokenizer(task.model)
        self._models: OrderedDict[str, PreTrainedModel] = OrderedDict()
        self.models_kept = max(1, models_kept)
        base = load_model(task.model, dtype=model_dtype(self.device), device=self.device)
        self.vocab_size = int(base.config.vocab_size)
        self._base = base
        self.last_stats: FileStats | None = None

    def model_for(self, path: Path, sha256: str) -> PreTrainedModel:
        """The claimed checkpoint's weights in bf16 (as generated), on this validator's device, cached
        by sha256."""
        if sha256 in self._models:
            self._models.move_to_end(sha256)
            return self._models[sha256]
        model = load_model(self.task.model, dtype=model_dtype(self.device), device=self.device)
        load_weights(model, path)
        self._models[sha256] = model
        while len(self._models) > self.models_kept:
            self._models.popitem(last=False)
        return model

    def judge(self, path: Path, submission: Submission) -> Verdict:
        started = time.perf_counter()
        ctx = FileContext(
            path=Path(path), submission=submission, task=self.task, thresholds=self.thresholds,
            records=self.records, tokenizer=self.tokenizer, seen=self.seen, checkpoints=self.checkpoints,
            vocab_size=self.vocab_size, task_id=self.task_id,
        )  # fmt: skip
        timings: dict[str, float] = {}

        def run(name: str, check: Callable[[], T]) -> T:
            t0 = time.perf_counter()
            try:
                return check()
            finally:
                timings[name] = round(time.perf_counter() - t0, 6)

        def verdict(kind: VerdictKind, reasons: list[str]) -> Verdict:
            return Verdict(
                file=str(path), verdict=kind, reasons=reasons, rows=len(ctx.rows), tokens=ctx.tokens,
                step=ctx.info.step if ctx.info else None, seconds=round(time.perf_counter() - started, 6),
                timings=timings, judged_by=self.limits.judged_by(),
            )  # fmt: skip

        self.last_stats = None
        if not ctx.path.is_file():
            return verdict("soft_invalidate", [f"file: {path} does not exist"])
        soft = run("identity", lambda: file_identity(ctx, self.max_bytes))
        if soft:
            return verdict("soft_invalidate", soft)
        reasons = run("schema", lambda: schema_and_bounds(ctx, self.reader))
        if ctx.info is None:
            return verdict("invalidate", reasons)
        # Before any check can fail: every file with a readable header uses its counter (see there).
        selection = run("order", lambda: counter_order(ctx, self.windows))
        reasons += run("work_units", lambda: work_units(ctx))
        reasons += run("duplicates", lambda: duplicates(ctx))
        reasons += run("plan", lambda: plan_derivation(ctx))
        reasons += run("freshness", lambda: freshness(ctx))
        unverifiable = [] if reasons else run("window", lambda: unverifiable_freshness(ctx))
        if not reasons and not unverifiable:
            reasons += run("rewards", lambda: rewards_and_advantages(ctx))
        recomputed: tuple[list[str], VerdictKind] = ([], "accept")
        if not reasons and not unverifiable:
            recomputed = run("recompute", lambda: self._recompute(ctx))
        self.seen.remember(submission.pool_id, ctx.sha256, ctx.row_hashes + [ctx.plan_key])
        if reasons:
            return verdict("invalidate", reasons)
        said, kind = recomputed  # graded by its evidence (workloads/inference/judge/grades.py)
        if not said and unverifiable:  # not paid, never slashed
            said, kind = unverifiable, "soft_invalidate"
        elif not said and selection:
            said, kind = selection, "soft_invalidate"
        if kind == "soft_invalidate":  # its counter used, not paid on its merits: held as a withheld batch
            forfeit(ctx, self.windows, said)
        return verdict(kind, said)

    def _recompute(self, ctx: FileContext) -> tuple[list[str], VerdictKind]:
        """Check 8, graded (workloads/inference/judge/grades.py): its reasons and the verdict they make.
        Strong evidence
        → `invalidate`; marginal → a second look at the failing rows, then `soft_invalidate` unless the
        node's window holds enough marked files already; no calibration record for the task's model →
        at most `soft_invalidate` (exact rules aside); nothing that repeats → the pooled statistics."""
        assert ctx.info is not None and ctx.info.checkpoint_step is not None
        known = self.checkpoints.checkpoint_for(ctx.info.checkpoint_step)
        assert known is not None  # freshness passed
        model = self.model_for(*known)
        th = self.thresholds

        def findings_for(rows: list[Rollout], batch: int) -> tuple[list[Finding], FileStats]:
            return recompute(
                model, rows, eos_token_id=int(self.tokenizer.eos_token_id),
                pad_token_id=int(self.tokenizer.pad_token_id), max_new_tokens=self.task.max_new_tokens,
                th=th.model_copy(update={"prefill_batch_size": batch}),
            )  # fmt: skip

        uncalibrated = f" [{self.limits.uncalibrated_reason(self.task.model)}]"
        findings, stats = findings_for(ctx.rows, th.prefill_batch_size)
        stats.file = ctx.sha256
        self.last_stats = stats
        if findings and self.calibration is None and not any(f.exact for f in findings):
            return [f.reason + uncalibrated for f in findings], "soft_invalidate"
        graded = grade(findings, th)
        if graded == "marginal" or strong_by_far_rows_alone(findings, th):
            findings = self._second_look(ctx, findings, findings_for)  # what does not repeat is no evidence
            graded = grade(findings, th)
        if graded == "strong":
            return self._close(ctx, [f.reason for f in findings])
        stats.marginal = bool(findings)  # marginal, and seen again
        # Pooled over the node's recent files: a small file has too few chunks or tokens for the
        # distribution statistics, a node's window has enough (a cheater cannot stay under a minimum).
        # Only the files since the node's last `invalidate` (`open_window`): a slashed file's evidence
        # was used once, and never counts against the files after it.
        entry = stats.model_dump()
        window = open_window(unique_files(self.windows.push(ctx.submission.pool_id, self._node(ctx), entry,
                                                            th.pool_files)))  # fmt: skip
        held = window_named(window)
        if findings:
            marked = marked_files(window)
            if marked < th.marginal_files:
                why = f"marginal: not paid, not slashed; marginal files among {held}: {marked}"
                return [f"{f.reason} [{why}, {th.marginal_files} slash]" for f in findings], "soft_invalidate"
            return self._close(ctx, [f"{f.reason} [repeated: marginal file {marked} among {held}; "
                                     f"{th.marginal_files} slash]" for f in findings])  # fmt: skip
        if len(window) < 2:
            return [], "accept"
        together = pooled([FileStats.model_validate(w) for w in window])
        found = distribution_findings(together, th, held)
        if not found:
            return [], "accept"
        if self.calibration is None:
            return [f"{f.reason} (pooled){uncalibrated}" for f in found], "soft_invalidate"
        if grade(found, th) == "strong":
            return self._close(ctx, [f"{f.reason} (pooled)" for f in found])
        return [f"{f.reason} (pooled)" for f in found], "soft_invalidate"

    def _node(self, ctx: FileContext) -> str:
        assert ctx.info is not None
        return ctx.submission.node or ctx.info.node_address

    def _close(self, ctx: FileContext, reasons: list[str]) -> tuple[list[str], VerdictKind]:
        """`invalidate`, and the node's window closed behind this file: the files after it are pooled
        and counted from here on (`open_window`), so a caught cheat never weighs on them."""
        self.windows.push(ctx.submission.pool_id, self._node(ctx), {"file": ctx.sha256, CLOSED: True},
                          self.thresholds.pool_files)  # fmt: skip
        return reasons, "invalidate"

    def _second_look(
        self,
        ctx: FileContext,
        findings: list[Finding],
        findings_for: Callable[[list[Rollout], int], tuple[list[Finding], FileStats]],
    ) -> list[Finding]:
        """The failing rows recomputed alone at another prefill batch: a row rule's failure that does
        not repeat is dropped (no evidence); file statistics stand (they are over every row). Returns
        what repeats, with the rows named as in the file."""
        rows = sorted({r for f in findings for r in f.rows})
        kept = [f for f in findings if not f.rows]
        if not rows:
            return kept
        again, _ = findings_for([ctx.rows[r] for r in rows], self.thresholds.recheck_prefill_batch_size)
        for f in again:
            if f.rows:  # rows of the subset → rows of the file
                named, far = [rows[i] for i in f.rows], [rows[i] for i in f.far_rows]
                head, sep, tail = f.reason.partition(FAR)
                kept.append(f.model_copy(update={
                    "rows": named, "far_rows": far,
                    "reason": head.replace(rows_named(f.rows), rows_named(named), 1) + sep
                    + tail.replace(rows_named(f.far_rows), rows_named(far), 1) + " (seen again at "
                    f"prefill batch {self.thresholds.recheck_prefill_batch_size})",
                }))  # fmt: skip
        return kept
