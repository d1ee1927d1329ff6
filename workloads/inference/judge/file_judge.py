"""The validation pipeline: one rollout file + its submission → a verdict with reasons.

Checks run cheapest first (docs/validator.md): 1 identity → 2 schema and bounds → 3 work units →
4 duplicates → 5 plan derivation → 6 freshness → 7 rewards → 8 recompute (prefill: termination,
sampling, logprobs, TOPLOC). A failure of 1 is `soft_invalidate` (no slash: storage may be at
fault); any failure of 2–7 is `invalidate`; a failure of 8 is graded by its evidence
(workloads/inference/judge/grades.py): strong → `invalidate`, marginal → looked at again, then
`soft_invalidate`
(the node's fourth marginal file in its window: `invalidate`). The recompute runs only when 2–7
passed: a file that already failed needs no forward pass to be rejected.

Check 8's limits are the calibration record's part for the task's backend on the device the file says
it was made on (`BatchInfo.device`): they decide pay. The device is the node's word, so a slash rests
only on evidence strong under every part the record holds for the backend (`Limits.others`), and on a
device the record has no part for, check 8 never slashes (workloads/inference/judge/calibration.py).
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
    Grade,
    grade,
    marked_files,
    open_window,
    strong_by_far_rows_alone,
    unique_files,
    window_named,
)
from workloads.inference.judge.reader import CappedReader, shared_reader
from workloads.inference.judge.thresholds import ValidationThresholds
from workloads.inference.task import TaskSettings
from workloads.model.loading import load_model, load_tokenizer, load_weights
from workloads.rollouts import Rollout

log = structlog.get_logger(__name__)
T = TypeVar("T")
RANK: dict[Grade, int] = {"none": 0, "marginal": 1, "strong": 2}
# A pooled statistic counted under each file's own part's limits (tokens beyond its `logprob_outlier`):
# not a figure another part's limits can grade, so it never makes a slash under another part.
COUNTED_UNDER_OWN_LIMITS = frozenset({"logprob outliers"})
DEVICES_KEPT = 8  # devices whose limits a judge keeps at hand (a file names its own: bounded anyway)


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
        # These are the task's limits for files made on the CPU; a file made elsewhere is judged by the
        # part for its own device (`_limits`).
        # A record's limits hold where it recomputed (the CPU): judging elsewhere, they never slash.
        self.limits = limits or resolve_limits(task.model, backend=task.backend,
                                               judge_device=self.device.type)  # fmt: skip
        self._by_device: dict[str, Limits] = {self.limits.device: self.limits}
        # The record, where it calibrates the task's model AND its generating backend, on some device
        # (issue 57).
        record = self.limits.record
        self.calibration: CalibrationRecord | None = (
            record if record is not None and record.devices(self.limits.backend)
            and self.limits.judge_device == record.recomputed_on else None
        )  # fmt: skip
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
                timings=timings, judged_by=self._limits(ctx).judged_by(),
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

    def _limits(self, ctx: FileContext) -> Limits:
        """The limits of the device the file says it was made on (before its header is read: the task's
        on the CPU)."""
        device = ctx.info.device if ctx.info is not None else self.limits.device
        limits = self._by_device.get(device) or self.limits.on(device)
        if len(self._by_device) < DEVICES_KEPT:
            self._by_device[device] = limits
        return limits

    def _findings(self, model: PreTrainedModel, rows: list[Rollout], th: ValidationThresholds,
                  batch: int | None = None) -> tuple[list[Finding], FileStats]:  # fmt: skip
        return recompute(
            model, rows, eos_token_id=int(self.tokenizer.eos_token_id),
            pad_token_id=int(self.tokenizer.pad_token_id), max_new_tokens=self.task.max_new_tokens,
            th=th.model_copy(update={"prefill_batch_size": batch or th.prefill_batch_size}),
        )  # fmt: skip

    def _recompute(self, ctx: FileContext) -> tuple[list[str], VerdictKind]:
        """Check 8, graded (workloads/inference/judge/grades.py) under the part for the file's device:
        its reasons and the verdict they make. Strong evidence under every part of the task's backend
        → `invalidate`; marginal → a second look at the failing rows, then `soft_invalidate` unless the
        node's window holds enough marked files already; no calibration record for the task's model,
        backend and the file's device → at most `soft_invalidate` (exact rules aside); nothing that
        repeats → the pooled statistics."""
        assert ctx.info is not None and ctx.info.checkpoint_step is not None
        known = self.checkpoints.checkpoint_for(ctx.info.checkpoint_step)
        assert known is not None  # freshness passed
        model = self.model_for(*known)
        limits = self._limits(ctx)
        th = limits.thresholds
        findings, stats = self._findings(model, ctx.rows, th)
        stats.file = ctx.sha256
        self.last_stats = stats
        if findings and not limits.calibrated() and not any(f.exact for f in findings):
            why = limits.uncalibrated_reason(self.task.model)
            return [f"{f.reason} [{why}]" for f in findings], "soft_invalidate"
        findings, graded = self._looked_at(ctx, model, findings, th)
        slash, weaker = self._slash_grade(ctx, model, limits, graded)
        if slash == "strong":
            return self._close(ctx, [f.reason for f in findings])
        stats.marginal = bool(findings) and slash != "none"  # marked only where every part finds it
        # Pooled over the node's recent files: a small file has too few chunks or tokens for the
        # distribution statistics, a node's window has enough (a cheater cannot stay under a minimum).
        # Only the files since the node's last `invalidate` (`open_window`): a slashed file's evidence
        # was used once, and never counts against the files after it.
        entry = stats.model_dump()
        window = open_window(unique_files(self.windows.push(ctx.submission.pool_id, self._node(ctx), entry,
                                                            th.pool_files)))  # fmt: skip
        held = window_named(window)
        if findings:
            return self._not_paid(ctx, limits, findings, (graded, slash, weaker), window, held)
        if len(window) < 2:
            return [], "accept"
        return self._pooled(ctx, limits, window, held)

    def _looked_at(self, ctx: FileContext, model: PreTrainedModel, findings: list[Finding],
                   th: ValidationThresholds) -> tuple[list[Finding], Grade]:  # fmt: skip
        """The findings' grade under `th`, after a second look where a marginal grade (or far rows alone)
        would otherwise decide: what does not repeat is no evidence."""
        graded = grade(findings, th)
        if graded == "marginal" or strong_by_far_rows_alone(findings, th):
            again = lambda rows, batch: self._findings(model, rows, th, batch)  # noqa: E731
            findings = self._second_look(ctx, findings, again, th.recheck_prefill_batch_size)
            graded = grade(findings, th)
        return findings, graded

    def _slash_grade(self, ctx: FileContext, model: PreTrainedModel, limits: Limits,
                     graded: Grade) -> tuple[Grade, str]:  # fmt: skip
        """The grade a slash may rest on: the lowest of the file's grade under its own part and under
        every other part the record holds for the backend (recomputed under each: the file's device is
        its own word), and the part that gave it ("" where no other part grades it lower). Other parts
        are only looked at where the file's own grade found something: no cost on an honest file, and
        none where the backend has one part (every shipped record)."""
        lowest, weaker = graded, ""
        for name, other in limits.others:
            if lowest == "none":
                break
            found, _ = self._findings(model, ctx.rows, other)
            _, under = self._looked_at(ctx, model, found, other)
            if RANK[under] < RANK[lowest]:
                lowest, weaker = under, name
        return lowest, weaker

    def _not_paid(self, ctx: FileContext, limits: Limits, findings: list[Finding],
                  grades: tuple[Grade, Grade, str], window: list[dict[str, object]],
                  held: str) -> tuple[list[str], VerdictKind]:  # fmt: skip
        """A file with findings that are not, alone, a slash: not paid; slashed as the node's
        `marginal_files`-th marked file. `grades`: under the file's own part, under every part, and the
        part that graded lower ("")."""
        th = limits.thresholds
        graded, slash, weaker = grades
        note = "marginal: "
        if weaker:  # the file's own part grades it higher than another part of its backend
            note = f"{graded} under the {limits.part} limits the file claims, {slash} under {weaker}'s: "
        if slash == "none":
            return [f"{f.reason} [{note}not paid, not slashed]" for f in findings], "soft_invalidate"
        marked = marked_files(window)
        if marked < th.marginal_files:
            why = f"{note}not paid, not slashed; marginal files among {held}: {marked}"
            return [f"{f.reason} [{why}, {th.marginal_files} slash]" for f in findings], "soft_invalidate"
        return self._close(ctx, [f"{f.reason} [repeated: marginal file {marked} among {held}; "
                                 f"{th.marginal_files} slash]" for f in findings])  # fmt: skip

    def _pooled(self, ctx: FileContext, limits: Limits, window: list[dict[str, object]],
                held: str) -> tuple[list[str], VerdictKind]:  # fmt: skip
        """The distribution statistics over the node's window: not paid past the file's part's limits,
        slashed only where strong under every part of the backend."""
        th = limits.thresholds
        together = pooled([FileStats.model_validate(w) for w in window])
        found = distribution_findings(together, th, held)
        if not found:
            return [], "accept"
        if not limits.calibrated():
            return [f"{f.reason} (pooled) [{limits.uncalibrated_reason(self.task.model)}]" for f in found], \
                "soft_invalidate"  # fmt: skip

        def strong_under(other: ValidationThresholds) -> bool:
            kept = [f for f in distribution_findings(together, other, held)
                    if f.rule not in COUNTED_UNDER_OWN_LIMITS]  # fmt: skip
            return grade(kept, other) == "strong"

        reasons = [f"{f.reason} (pooled)" for f in found]
        if grade(found, th) == "strong" and all(strong_under(other) for _, other in limits.others):
            return self._close(ctx, reasons)
        return reasons, "soft_invalidate"

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
        batch: int | None = None,
    ) -> list[Finding]:
        """The failing rows recomputed alone at another prefill batch (`batch`, else the task's
        `recheck_prefill_batch_size`): a row rule's failure that does not repeat is dropped (no evidence);
        file statistics stand (they are over every row). Returns what repeats, with the rows named as in
        the file."""
        batch = batch or self.thresholds.recheck_prefill_batch_size
        rows = sorted({r for f in findings for r in f.rows})
        kept = [f for f in findings if not f.rows]
        if not rows:
            return kept
        again, _ = findings_for([ctx.rows[r] for r in rows], batch)
        for f in again:
            if f.rows:  # rows of the subset → rows of the file
                named, far = [rows[i] for i in f.rows], [rows[i] for i in f.far_rows]
                head, sep, tail = f.reason.partition(FAR)
                kept.append(f.model_copy(update={
                    "rows": named, "far_rows": far,
                    "reason": head.replace(rows_named(f.rows), rows_named(named), 1) + sep
                    + tail.replace(rows_named(f.far_rows), rows_named(far), 1) + " (seen again at "
                    f"prefill batch {batch})",
                }))  # fmt: skip
        return kept
