"""Check 8, the expensive one: one batched prefill of the claimed checkpoint over prompt + output,
then termination, Gumbel sampling replay from the seed, logprobs and TOPLOC proofs of the final
hidden states, per row and, for subtle cheats no single chunk shows, over the whole file."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from pydantic import BaseModel
from transformers import PreTrainedModel

from workloads.inference.judge.checks.context import rows_named
from workloads.inference.judge.checks.tokens import token_checks
from workloads.inference.judge.grades import Finding
from workloads.inference.judge.thresholds import ValidationThresholds
from workloads.model.prefill import prefill_batch
from workloads.model.sampler import replay_fault
from workloads.rollouts import Rollout
from workloads.toploc import ToplocThresholds, verify_proofs_batch
from workloads.toploc import Verdict as ProofVerdict

FAR = "; far past honest noise: "  # where a reason names its far rows (strong evidence alone)


class FileStats(BaseModel):
    """What calibration looks at: per-file aggregates and per-row worst values."""

    chunks: int = 0
    median_chunk_share: float = 0.0  # share of chunks whose mantissa-error median is >= 1
    mant_mean: float = 0.0  # mean over chunks of the chunk's mantissa-error mean
    max_exp_mismatches: int = 0
    max_chunk_mean: float = 0.0
    max_chunk_median: float = 0.0
    max_gap: float = 0.0
    max_logprob_error: float = 0.0
    min_eos_logprob: float = 0.0
    max_row_mean_share: float = 0.0  # largest row mean |logprob error| over its length-aware limit
    max_row_outliers: int = 0  # most outlier tokens in one row
    # sums the pooled (per-node window) statistics add up across files
    median_chunks: int = 0  # chunks whose mantissa-error median is >= 1
    mant_sum: float = 0.0  # sum over chunks of the chunk's mantissa-error mean
    lp_tokens: int = 0
    lp_signed_sum: float = 0.0  # sum of claimed - recomputed logprob over every output token
    lp_abs_sum: float = 0.0  # sum of |claimed - recomputed| logprob over every output token
    rows: int = 0
    lp_outliers: int = 0  # tokens whose |claimed - recomputed| logprob is beyond logprob_outlier
    # what the validator's window keeps with the sums (workloads/inference/judge/grades.py)
    file: str = ""  # the file's sha256: a file judged twice counts once
    marginal: bool = False  # the file failed marginally, and the second look confirmed it

    @property
    def lp_bias(self) -> float:
        return self.lp_signed_sum / self.lp_tokens if self.lp_tokens else 0.0


def pooled(window: list[FileStats]) -> FileStats:
    """A node's recent files as one: the sums added, the shares and means recomputed."""
    chunks = sum(w.chunks for w in window)
    medians = sum(w.median_chunks for w in window)
    mant = sum(w.mant_sum for w in window)
    return FileStats(
        chunks=chunks, median_chunks=medians, mant_sum=mant,
        median_chunk_share=medians / chunks if chunks else 0.0, mant_mean=mant / chunks if chunks else 0.0,
        lp_tokens=sum(w.lp_tokens for w in window), lp_signed_sum=sum(w.lp_signed_sum for w in window),
        rows=sum(w.rows for w in window), lp_outliers=sum(w.lp_outliers for w in window),
        lp_abs_sum=sum(w.lp_abs_sum for w in window),
    )  # fmt: skip


def distribution_reasons(stats: FileStats, th: ValidationThresholds, what: str) -> list[str]:
    return [f.reason for f in distribution_findings(stats, th, what)]


def distribution_findings(stats: FileStats, th: ValidationThresholds, what: str) -> list[Finding]:
    """The statistics no single chunk or row shows: the model/dtype fingerprint of the TOPLOC
    mantissa errors (once enough chunks are pooled), a consistent logprob bias, and outlier tokens
    spread one a row (each under the per-row rules). `excess`: how far past its limit, for the grade."""
    found = []
    if stats.chunks >= th.file_min_chunks:
        if stats.median_chunk_share > th.file_max_median_chunks:
            found.append(Finding(
                rule="toploc share", excess=stats.median_chunk_share / max(th.file_max_median_chunks, 1e-9),
                reason=f"toploc: {stats.median_chunk_share:.0%} of the chunks of {what} have a mantissa "
                f"median >= 1 (honest: at most {th.file_max_median_chunks:.0%}); not the claimed model and "
                "dtype",
            ))  # fmt: skip
        if stats.mant_mean >= th.file_max_mant_mean:
            found.append(Finding(
                rule="toploc mean", excess=stats.mant_mean / th.file_max_mant_mean,
                reason=f"toploc: mean mantissa error {stats.mant_mean:.3f} over {what} is at or above "
                f"{th.file_max_mant_mean}; not the claimed model and dtype",
            ))  # fmt: skip
    if stats.lp_tokens and abs(stats.lp_bias) > th.bias_limit(stats.lp_tokens):
        found.append(Finding(
            rule="logprob bias", excess=abs(stats.lp_bias) / th.bias_limit(stats.lp_tokens),
            reason=f"logprobs: a consistent bias of {stats.lp_bias:+.4f} nats over {what} ({stats.lp_tokens} "
            f"tokens; honest: within ±{th.bias_limit(stats.lp_tokens):.4f})",
        ))  # fmt: skip
    if stats.lp_outliers > th.outlier_limit(stats.rows):
        limit = th.outlier_limit(stats.rows)
        found.append(Finding(
            rule="logprob outliers", excess=stats.lp_outliers / max(limit, 1.0),
            reason=f"logprobs: {stats.lp_outliers} tokens of {what} ({stats.rows} rows) off the recomputed "
            f"ones by more than {th.logprob_outlier} (honest: at most {limit:.1f}; ~1 row in 6,000 has one)",
        ))  # fmt: skip
    return found


CUT_SHORT = "output cut short (no EOS, under the task's max_new_tokens)"
EXACT = frozenset({"tokens after EOS", CUT_SHORT})  # found while recomputing, yet no rounding breaks them


def recompute(
    model: PreTrainedModel,
    rows: list[Rollout],
    *,
    eos_token_id: int,
    pad_token_id: int,
    max_new_tokens: int,
    th: ValidationThresholds,
) -> tuple[list[Finding], FileStats]:
    """THE recomputation: the validator's judge, its second look, calibration, the benches and the
    tests all run this, so a limit changed here is changed for each of them. One batched prefill per
    `th.prefill_batch_size` rows, then every row's rules (`RowTally`) and the file's statistics."""
    chunk_limits = ToplocThresholds(
        max_exp_mismatches=th.chunk_max_exp_mismatches,
        max_mant_err_mean=th.chunk_max_mant_mean,
        max_mant_err_median=th.chunk_max_mant_median,
    )
    tally = RowTally(th, eos_token_id=eos_token_id, max_new_tokens=max_new_tokens)
    for start in range(0, len(rows), th.prefill_batch_size):
        chunk = rows[start : start + th.prefill_batch_size]
        # Prefill logits do not depend on temperature; it only rescales them, per row (token_checks).
        result = prefill_batch(
            model, [r.input_tokens for r in chunk], [r.output_tokens for r in chunk], 1.0, pad_token_id
        )
        gaps, logprobs = token_checks(chunk, result)
        # TOPLOC for every row at once: grouped top-k and one polynomial evaluation for all chunks.
        verdicts = verify_proofs_batch([p.hidden for p in result], [r.proofs for r in chunk], chunk_limits)
        for offset, (r, verdict) in enumerate(zip(chunk, verdicts, strict=True)):
            tally.row(start + offset, r, verdict, gaps[offset], logprobs[offset])
    stats = tally.stats(len(rows))
    return tally.findings() + distribution_findings(stats, th, "the file"), stats


@dataclass
class RowTally:
    """What a recomputation has found so far, row by row in the file's order (so a reason names rows
    as the file numbers them): the rows failing each rule, those failing it far past anything honest
    (strong evidence alone, grades.py), and the per-chunk, per-row and per-token figures the file's
    statistics (`FileStats`) are made of."""

    th: ValidationThresholds
    eos_token_id: int
    max_new_tokens: int
    failed: dict[str, list[int]] = field(default_factory=dict)
    far: dict[str, list[int]] = field(default_factory=dict)
    sampling_why: list[str] = field(default_factory=list)  # the first two faults, with their rows
    means: list[float] = field(default_factory=list)  # per TOPLOC chunk
    medians: list[float] = field(default_factory=list)
    exps: list[int] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)  # per row: its largest Gumbel gap
    lp_errors: list[float] = field(default_factory=list)  # per row: its largest |logprob error|
    eos_lps: list[float] = field(default_factory=list)
    row_shares: list[float] = field(default_factory=list)
    row_outliers: list[int] = field(default_factory=list)
    lp_signed: float = 0.0
    lp_abs: float = 0.0
    lp_tokens: int = 0
    lp_outliers: int = 0

    def row(self, i: int, r: Rollout, verdict: ProofVerdict, gaps: torch.Tensor, lp: torch.Tensor) -> None:
        """Row `i` of the file: its TOPLOC verdict, Gumbel gaps and recomputed logprobs, every rule."""
        self.toploc(i, verdict)
        self.sampling(i, gaps)
        self.logprobs(i, r, lp)
        self.termination(i, r.output_tokens, gaps, lp)

    def fail(self, rule: str, i: int, far: bool = False) -> None:
        self.failed.setdefault(rule, []).append(i)
        if far:
            self.far.setdefault(rule, []).append(i)

    def toploc(self, i: int, verdict: ProofVerdict) -> None:
        for c in verdict.chunks:
            self.means.append(c.mant_err_mean)
            self.medians.append(c.mant_err_median)
            self.exps.append(c.exp_mismatches)
        if not verdict.passed:
            far = any(self.th.far_chunk(c.exp_mismatches, c.mant_err_mean) for c in verdict.chunks)
            self.fail("toploc", i, far)

    def sampling(self, i: int, gaps: torch.Tensor) -> None:
        self.gaps.append(float(gaps.max()))
        fault = replay_fault(gaps, self.th.replay_limits())
        if fault:
            self.fail("sampling", i, self.gaps[-1] >= self.th.row_far_factor * self.th.sampling_max_gap)
            if len(self.sampling_why) < 2:
                self.sampling_why.append(f"row {i}: {fault}")

    def logprobs(self, i: int, r: Rollout, lp: torch.Tensor) -> None:
        th = self.th
        signed = torch.tensor(r.output_logprobs, dtype=torch.float32) - lp
        diff = signed.abs()
        err = float(diff.max())
        self.lp_errors.append(err)
        self.lp_signed += float(signed.sum())
        self.lp_abs += float(diff.sum())
        self.lp_tokens += len(r.output_tokens)
        outliers = int((diff > th.logprob_outlier).sum())
        self.lp_outliers += outliers
        self.row_shares.append(float(diff.mean()) / th.row_mean_limit(len(r.output_tokens)))
        self.row_outliers.append(outliers)
        if (err > th.logprob_tolerance or float(diff.mean()) > th.row_mean_limit(len(r.output_tokens))
                or outliers > th.logprob_max_outliers):  # fmt: skip
            self.fail("logprobs", i, err >= th.row_far_factor * th.logprob_tolerance)

    def termination(self, i: int, tokens: list[int], gaps: torch.Tensor, lp: torch.Tensor) -> None:
        if self.eos_token_id in tokens[:-1]:
            self.fail("tokens after EOS", i)
        elif tokens[-1] == self.eos_token_id:
            self.eos_lps.append(float(lp[-1]))
            # An unlikely EOS is forced only if the seed's Gumbel replay would not have picked it:
            # honest samples do land on rare EOS tokens now and then.
            if float(lp[-1]) < self.th.min_eos_logprob and float(gaps[-1]) > self.th.sampling_max_gap:
                self.fail("an unlikely (forced) EOS", i)
        elif len(tokens) != self.max_new_tokens:
            self.fail(CUT_SHORT, i)

    def stats(self, rows: int) -> FileStats:
        medians, means = self.medians, self.means
        return FileStats(
            chunks=len(means),
            median_chunk_share=float(np.mean(np.asarray(medians) >= 1)) if medians else 0.0,
            mant_mean=float(np.mean(means)) if means else 0.0,
            max_exp_mismatches=max(self.exps, default=0),
            max_chunk_mean=max(means, default=0.0),
            max_chunk_median=max(medians, default=0.0),
            max_gap=max(self.gaps, default=0.0),
            max_logprob_error=max(self.lp_errors, default=0.0),
            min_eos_logprob=min(self.eos_lps, default=0.0),
            max_row_mean_share=max(self.row_shares, default=0.0),
            max_row_outliers=max(self.row_outliers, default=0),
            median_chunks=int(np.sum(np.asarray(medians) >= 1)) if medians else 0,
            mant_sum=float(np.sum(means)) if means else 0.0,
            lp_tokens=self.lp_tokens,
            lp_signed_sum=self.lp_signed,
            lp_abs_sum=self.lp_abs,
            rows=rows,
            lp_outliers=self.lp_outliers,
        )

    def findings(self) -> list[Finding]:
        """One finding per failed row rule, in the order first failed, its rows (and far rows) named."""
        th = self.th
        why = "; ".join(self.sampling_why)
        labels = {
            "toploc": "TOPLOC proofs that do not match the recomputed hidden states",
            "sampling": f"tokens the seed's Gumbel sampling does not reproduce ({why})",
            "logprobs": f"logprobs off the recomputed ones (row mean > {th.logprob_mean_tolerance} + "
                        f"{th.logprob_tolerance}/tokens, a token > {th.logprob_tolerance}, or more than "
                        f"{th.logprob_max_outliers} token(s) > {th.logprob_outlier})",
        }
        far_mant = th.toploc_far_mant_factor * th.chunk_max_mant_mean
        far_why = {
            "toploc": f"a chunk with {th.toploc_far_factor * th.chunk_max_exp_mismatches:g}+ of its 128 "
                      f"exponents wrong or a mantissa mean of {far_mant:g}+ (a proof of other hidden states)",
            "sampling": f"a Gumbel gap of {th.row_far_factor * th.sampling_max_gap:g}+ "
                        f"({th.row_far_factor:g}x the limit)",
            "logprobs": f"a token off by {th.row_far_factor * th.logprob_tolerance:g}+ nats "
                        f"({th.row_far_factor:g}x the limit)",
        }
        return [
            Finding(
                rule=what, rows=rows_, exact=what in EXACT, far_rows=self.far.get(what, []),
                reason=f"{'termination' if what not in labels else what}: {rows_named(rows_)} with "
                f"{labels.get(what, what)}" + (f"{FAR}{rows_named(self.far[what])} with "
                                              f"{far_why[what]}" if self.far.get(what) else ""),
            )  # fmt: skip
            for what, rows_ in self.failed.items()
        ]
