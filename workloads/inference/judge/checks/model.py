"""Check 8, the expensive one: one batched prefill of the claimed checkpoint over prompt + output,
then termination, Gumbel sampling replay from the seed, logprobs and TOPLOC proofs of the final
hidden states, per row and, for subtle cheats no single chunk shows, over the whole file."""

from __future__ import annotations

import numpy as np
import torch
from pydantic import BaseModel
from transformers import PreTrainedModel

from workloads.inference.judge.checks.context import rows_named
from workloads.inference.judge.grades import Finding
from workloads.inference.judge.thresholds import ValidationThresholds
from workloads.inference.verify import token_checks
from workloads.model.prefill import prefill_batch
from workloads.model.sampler import replay_fault
from workloads.rollouts import Rollout
from workloads.toploc import ToplocThresholds, verify_proofs_batch

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


def recompute(
    model: PreTrainedModel,
    rows: list[Rollout],
    *,
    eos_token_id: int,
    pad_token_id: int,
    max_new_tokens: int,
    th: ValidationThresholds,
) -> tuple[list[Finding], FileStats]:
    chunk_limits = ToplocThresholds(
        max_exp_mismatches=th.chunk_max_exp_mismatches,
        max_mant_err_mean=th.chunk_max_mant_mean,
        max_mant_err_median=th.chunk_max_mant_median,
    )
    failed: dict[str, list[int]] = {}
    far: dict[str, list[int]] = {}  # rows failing far past anything honest (strong alone)
    far_gap = th.row_far_factor * th.sampling_max_gap
    sampling_why: list[str] = []  # the first two faults, with their rows, for the reason
    replay = th.replay_limits()
    means, medians, exps, gaps_all, lp_errors, eos_lps = [], [], [], [], [], []
    row_shares, row_outliers = [], []
    lp_signed, lp_abs, lp_tokens, lp_outliers = 0.0, 0.0, 0, 0
    for start in range(0, len(rows), th.prefill_batch_size):
        chunk = rows[start : start + th.prefill_batch_size]
        result = prefill_batch(
            model, [r.input_tokens for r in chunk], [r.output_tokens for r in chunk], 1.0, pad_token_id
        )
        gaps, logprobs = token_checks(chunk, result)
        verdicts = verify_proofs_batch([p.hidden for p in result], [r.proofs for r in chunk], chunk_limits)
        for offset, (r, verdict) in enumerate(zip(chunk, verdicts, strict=True)):
            i = start + offset
            for c in verdict.chunks:
                means.append(c.mant_err_mean)
                medians.append(c.mant_err_median)
                exps.append(c.exp_mismatches)
            if not verdict.passed:
                failed.setdefault("toploc", []).append(i)
                if any(th.far_chunk(c.exp_mismatches, c.mant_err_mean) for c in verdict.chunks):
                    far.setdefault("toploc", []).append(i)
            gaps_all.append(float(gaps[i - start].max()))
            fault = replay_fault(gaps[i - start], replay)
            if fault:
                failed.setdefault("sampling", []).append(i)
                if gaps_all[-1] >= far_gap:
                    far.setdefault("sampling", []).append(i)
                if len(sampling_why) < 2:
                    sampling_why.append(f"row {i}: {fault}")
            lp = logprobs[i - start]
            signed = torch.tensor(r.output_logprobs, dtype=torch.float32) - lp
            diff = signed.abs()
            err = float(diff.max())
            lp_errors.append(err)
            lp_signed += float(signed.sum())
            lp_abs += float(diff.sum())
            lp_tokens += len(r.output_tokens)
            outliers = int((diff > th.logprob_outlier).sum())
            lp_outliers += outliers
            row_shares.append(float(diff.mean()) / th.row_mean_limit(len(r.output_tokens)))
            row_outliers.append(outliers)
            if (err > th.logprob_tolerance or float(diff.mean()) > th.row_mean_limit(len(r.output_tokens))
                    or outliers > th.logprob_max_outliers):  # fmt: skip
                failed.setdefault("logprobs", []).append(i)
                if err >= th.row_far_factor * th.logprob_tolerance:
                    far.setdefault("logprobs", []).append(i)
            tokens = r.output_tokens
            if eos_token_id in tokens[:-1]:
                failed.setdefault("tokens after EOS", []).append(i)
            elif tokens[-1] == eos_token_id:
                eos_lps.append(float(lp[-1]))
                # An unlikely EOS is forced only if the seed's Gumbel replay would not have picked it:
                # honest samples do land on rare EOS tokens now and then.
                if float(lp[-1]) < th.min_eos_logprob and float(gaps[i - start][-1]) > th.sampling_max_gap:
                    failed.setdefault("an unlikely (forced) EOS", []).append(i)
            elif len(tokens) != max_new_tokens:
                failed.setdefault("output cut short (no EOS, under the task's max_new_tokens)", []).append(i)
    stats = FileStats(
        chunks=len(means),
        median_chunk_share=float(np.mean(np.asarray(medians) >= 1)) if medians else 0.0,
        mant_mean=float(np.mean(means)) if means else 0.0,
        max_exp_mismatches=max(exps, default=0),
        max_chunk_mean=max(means, default=0.0),
        max_chunk_median=max(medians, default=0.0),
        max_gap=max(gaps_all, default=0.0),
        max_logprob_error=max(lp_errors, default=0.0),
        min_eos_logprob=min(eos_lps, default=0.0),
        max_row_mean_share=max(row_shares, default=0.0),
        max_row_outliers=max(row_outliers, default=0),
        median_chunks=int(np.sum(np.asarray(medians) >= 1)) if medians else 0,
        mant_sum=float(np.sum(means)) if means else 0.0,
        lp_tokens=lp_tokens,
        lp_signed_sum=lp_signed,
        lp_abs_sum=lp_abs,
        rows=len(rows),
        lp_outliers=lp_outliers,
    )
    labels = {
        "toploc": "TOPLOC proofs that do not match the recomputed hidden states",
        "sampling": f"tokens the seed's Gumbel sampling does not reproduce ({'; '.join(sampling_why)})",
        "logprobs": f"logprobs off the recomputed ones (row mean > {th.logprob_mean_tolerance} + "
                    f"{th.logprob_tolerance}/tokens, a token > {th.logprob_tolerance}, or more than "
                    f"{th.logprob_max_outliers} token(s) > {th.logprob_outlier})",
    }
    exact = {"tokens after EOS", "output cut short (no EOS, under the task's max_new_tokens)"}
    far_why = {
        "toploc": f"a chunk with {th.toploc_far_factor * th.chunk_max_exp_mismatches:g}+ of its 128 "
                  "exponents wrong or a mantissa mean of "
                  f"{th.toploc_far_mant_factor * th.chunk_max_mant_mean:g}+ (a proof of other hidden states)",
        "sampling": f"a Gumbel gap of {far_gap:g}+ ({th.row_far_factor:g}x the limit)",
        "logprobs": f"a token off by {th.row_far_factor * th.logprob_tolerance:g}+ nats "
                    f"({th.row_far_factor:g}x the limit)",
    }
    findings = [
        Finding(
            rule=what, rows=rows_, exact=what in exact, far_rows=far.get(what, []),
            reason=f"{'termination' if what not in labels else what}: {rows_named(rows_)} with "
            f"{labels.get(what, what)}" + (f"{FAR}{rows_named(far[what])} with "
                                          f"{far_why[what]}" if far.get(what) else ""),
        )  # fmt: skip
        for what, rows_ in failed.items()
    ]
    findings += distribution_findings(stats, th, "the file")
    return findings, stats
