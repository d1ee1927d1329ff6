"""Thresholds of the recompute checks, calibrated on data (`bench/validator_calibration.py`,
figures in docs/validator.md): each sits between the worst honest value and the best cheating
value measured, with the margin on both sides stated there.

Defaults are for the shipped tiny model (4 layers, hidden 128) in bf16. Its honest recompute
differs from generation by less than one mantissa unit, so the reference's per-chunk limits
(exponent mismatches <= 38 of 128, mantissa mean < 10, median < 8), set for models whose bf16
rounding differences compound over dozens of layers, would pass fp32 inference and perturbed
weights. Real models: `ValidationThresholds.reference()` (documented beside ours).

Two levels:
- per chunk of 32 positions (one TOPLOC proof chunk): gross mismatches fail the row;
- per file: statistics over all chunks of all rows, which separate subtle cheats (fp32/fp16
  inference) that no single chunk can: honest files have (almost) no chunk whose mantissa-error
  median reaches 1 and a low mean error; a wrong dtype moves both for most chunks at once.
"""

from __future__ import annotations

import math

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from intellect.settings import IntellectSettings
from workloads.model.sampler import ReplayLimits


class ValidationThresholds(IntellectSettings):
    model_config = SettingsConfigDict(env_prefix="INTELLECT_VALIDATOR_", env_file=".env", extra="ignore")

    chunk_max_exp_mismatches: int = Field(12, ge=0, description="per chunk, out of 128 top-k points")
    chunk_max_mant_mean: float = Field(8.0, gt=0, description="per chunk: mantissa error mean must be below")
    chunk_max_mant_median: float = Field(4.0, gt=0, description="per chunk: mantissa error median below")
    file_max_median_chunks: float = Field(
        0.50, ge=0, le=1, description="per file: largest share of chunks whose mantissa median is >= 1"
    )
    file_max_mant_mean: float = Field(0.72, gt=0, description="per file: mean of the chunks' mantissa means")
    file_min_chunks: int = Field(8, ge=1, description="file-level statistics need at least this many chunks")
    # A claimed token's gap below the seed's Gumbel maximum on replay. Honest gaps come from bf16
    # near-ties (decode vs prefill rounding): on trained checkpoints a few tenths, one token in tens of
    # thousands (bench/sampling_calibration.py). One such token a row is allowed, never one past the cap.
    sampling_tolerance: float = Field(0.2, ge=0, description="a Gumbel score gap above this is a near tie")
    sampling_max_gap: float = Field(1.0, ge=0, description="a Gumbel score gap above this fails the row")
    sampling_max_near_ties: int = Field(1, ge=0, description="near-tie tokens allowed in one row")
    # Per token, an honest row stays within 0.09 on the base model, but on trained checkpoints about one
    # row in 6,000 had a single token beyond 0.15 (bf16 near-ties; 4 honest files slashed in a 40-step
    # demo). A forged row shifts many tokens, so the row's mean decides; the per-token cap only
    # bounds a single edit. Honest row means: p99 0.011, worst 0.015 (384 rows at step 40).
    logprob_tolerance: float = Field(0.5, ge=0, description="|claimed - recomputed| logprob, any one token")
    logprob_mean_tolerance: float = Field(
        0.05, ge=0, description="|claimed - recomputed| logprob, row mean, for long rows: a row of n tokens "
        "may reach this + logprob_tolerance / n (one honest outlier token moves a short row's mean a lot)",
    )
    # An honest row has at most one token beyond 0.15 in about 6,000 rows (bf16 near-ties on trained
    # checkpoints); edits of -0.45 on several tokens of a long row stay under the row mean.
    logprob_outlier: float = Field(0.15, ge=0, description="a token this far off is an outlier")
    logprob_max_outliers: int = Field(1, ge=0, description="outlier tokens allowed in one row")
    # Honest signed errors average to zero (measured: |file mean| <= 0.0007 over ~340 tokens, per-token
    # standard deviation 0.006); a worker adding a constant to its logprobs moves the mean by it.
    logprob_bias_floor: float = Field(0.01, ge=0, description="signed mean error allowed however many tokens")
    logprob_bias_sigma: float = Field(0.02, gt=0, description="per-token spread assumed (3x the measured)")
    logprob_bias_k: float = Field(6.0, gt=0, description="standard errors of the mean allowed on top")
    # Outlier tokens over a whole file (and a node's window): honest ~1 row in 6,000 has one (above);
    # one edit under the per-row rules on every row (the same -0.45 dent a row, any sign) has one a row.
    logprob_file_outliers: int = Field(2, ge=0, description="outlier tokens allowed in any file or window")
    logprob_outlier_rate: float = Field(
        0.002, ge=0, description="and per row on top (12x the honest 1 in 6,000 measured)"
    )
    pool_files: int = Field(16, ge=1, description="a node's recent files whose statistics are pooled")
    # Grades (workloads/inference/judge/grades.py): what makes a failed recomputation a slash and not
    # only "not paid".
    strong_rows: int = Field(3, ge=1, description="rows failing recomputed rules that are strong evidence")
    file_strong_factor: float = Field(
        1.25, ge=1, description="a file statistic this many times its limit is strong evidence"
    )
    # Evidence weighed by its size (issue 54): one row far past anything honest is enough. Honest worst
    # values sit at most at half of each row limit (limits.py), so 10x a limit is >= 20x the worst honest
    # value of every shipped record (Gumbel gap: >= 105x; token logprob error: >= 55x).
    row_far_factor: float = Field(
        10.0, ge=1, description="a row's Gumbel gap or token logprob error this many times its limit is "
        "strong evidence alone",
    )
    # A proof made for other hidden states: tiny, 682 pairs of equal-length rows of one file, each row
    # judged with the other's proofs (tests/workloads/judge/test_evidence.py makes such a file): the
    # worst chunk's exponent mismatches median 106 of 128, 5th percentile 43; 97.6 % reach 2x the limit
    # (24), 99 % with the mantissa rule (the rest are rows with the same tokens, hence the same proof).
    # Honest chunks reach 12 exponent mismatches (qwen-0.5b; 10 medium, 8 small) and a mantissa mean of
    # 2.3 (tiny-long): the far levels sit at >= 4x and >= 5x those, past limits that are >= 2x them.
    toploc_far_factor: float = Field(
        2.0, ge=1, description="a chunk with this many times chunk_max_exp_mismatches: strong evidence alone"
    )
    toploc_far_mant_factor: float = Field(
        1.5, ge=1, description="a chunk whose mantissa mean is this many times chunk_max_mant_mean: the same"
    )
    marginal_files: int = Field(
        4, ge=1, description="the node's marginal files among its last pool_files that make a slash"
    )
    recheck_prefill_batch_size: int = Field(1, ge=1, description="the second look's prefill batch")
    min_eos_logprob: float = Field(math.log(1e-4), description="an EOS less likely than this was forced")
    reward_tolerance: float = Field(1e-4, ge=0, description="float32 round-off allowed on rewards")
    advantage_tolerance: float = Field(1e-3, ge=0, description="float32 round-off allowed on advantages")
    prefill_batch_size: int = Field(64, ge=1, description="rows recomputed per forward pass")

    def far_chunk(self, exp_mismatches: int, mant_mean: float) -> bool:
        """One TOPLOC chunk that is strong evidence alone (a proof of other hidden states)."""
        return (exp_mismatches >= self.toploc_far_factor * max(1, self.chunk_max_exp_mismatches)
                or mant_mean >= self.toploc_far_mant_factor * self.chunk_max_mant_mean)  # fmt: skip

    def replay_limits(self) -> ReplayLimits:
        return ReplayLimits(self.sampling_tolerance, self.sampling_max_gap, self.sampling_max_near_ties)

    def row_mean_limit(self, tokens: int) -> float:
        """The largest honest row mean |error| for a row of `tokens` tokens."""
        return self.logprob_mean_tolerance + self.logprob_tolerance / max(1, tokens)

    def outlier_limit(self, rows: int) -> float:
        """The most outlier tokens (beyond `logprob_outlier`) honest files of `rows` rows hold."""
        return self.logprob_file_outliers + self.logprob_outlier_rate * rows

    def bias_limit(self, tokens: int) -> float:
        """The largest honest |signed mean error| over `tokens` tokens (one file, or a node's window)."""
        spread = self.logprob_bias_sigma / math.sqrt(max(1, tokens))
        return self.logprob_bias_floor + self.logprob_bias_k * spread

    @classmethod
    def defaults(cls) -> ValidationThresholds:
        """The shipped defaults, whatever the environment says (records and overrides go on top of
        these: `calibration.resolve_limits`)."""
        return cls.model_construct(**{
            name: field.get_default(call_default_factory=True) for name, field in cls.model_fields.items()
        })  # fmt: skip

    @classmethod
    def reference(cls) -> ValidationThresholds:
        """The reference's per-chunk limits for large models (INTELLECT-2 / SYNTHETIC-2)."""
        return cls(
            chunk_max_exp_mismatches=38,
            chunk_max_mant_mean=10.0,
            chunk_max_mant_median=8.0,
            file_max_median_chunks=1.0,
            file_max_mant_mean=10.0,
        )
