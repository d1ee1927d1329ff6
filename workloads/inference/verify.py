"""Recompute-and-check of rollouts, the validator's view of a file: one batched prefill over
prompt + output, then per row TOPLOC, sampling reproduction from the seed, logprob consistency and
termination. Lives here, next to the generator, so both sides share one definition of positions,
seeds and logprobs; the validator service calls it."""

from __future__ import annotations

import math

import torch
from pydantic import BaseModel
from transformers import PreTrainedModel

from workloads.model import sampler
from workloads.model.prefill import prefill_batch
from workloads.rollouts import Rollout
from workloads.toploc import ToplocThresholds, verify_proof


def tiny_model_thresholds() -> ToplocThresholds:
    """TOPLOC thresholds calibrated for the shipped 4-layer, 128-wide model.

    The reference thresholds (exponent mismatches <= 38, mantissa mean < 10, median < 8) are set for
    large models, whose bf16 rounding differences compound over dozens of layers. In the tiny model
    an honest recompute differs by less than one mantissa unit, and so do fp32 inference or a weight
    perturbation of a few percent: at the reference thresholds those pass. Measured on the tiny
    model (docs/workloads.md): honest chunks mean <= 0.7, median 0, exponent mismatches <= 2."""
    return ToplocThresholds(max_exp_mismatches=4, max_mant_err_mean=1.0, max_mant_err_median=1.0)


class CheckSettings(BaseModel):
    toploc: ToplocThresholds | None = None  # None: the reference thresholds
    sampling_tolerance: float = 0.25  # perturbed-score gap allowed for bf16 recompute near-ties
    logprob_tolerance: float = 0.25  # |claimed - recomputed| per token
    min_eos_logprob: float = math.log(1e-4)  # an EOS that unlikely was forced, not sampled
    prefill_batch_size: int = 64


class RolloutCheck(BaseModel):
    row: int
    passed: bool
    toploc: bool
    sampling: bool
    logprobs: bool
    termination: bool
    reasons: list[str]


def check_rollouts(
    model: PreTrainedModel,
    rollouts: list[Rollout],
    *,
    eos_token_id: int,
    max_new_tokens: int,
    settings: CheckSettings | None = None,
    pad_token_id: int = 0,
) -> list[RolloutCheck]:
    cfg = settings or CheckSettings()
    results: list[RolloutCheck] = []
    for start in range(0, len(rollouts), cfg.prefill_batch_size):
        chunk = rollouts[start : start + cfg.prefill_batch_size]
        # Temperature is per row; prefill logits do not depend on it, logprobs are rescaled below.
        recomputed = prefill_batch(
            model, [r.input_tokens for r in chunk], [r.output_tokens for r in chunk], 1.0, pad_token_id
        )
        for offset, (r, pre) in enumerate(zip(chunk, recomputed, strict=True)):
            reasons: list[str] = []
            verdict = verify_proof(pre.hidden, r.proofs, cfg.toploc)
            if not verdict.passed:
                reasons.append(f"toploc: {verdict.reason}")
            out = torch.tensor(r.output_tokens)
            gaps = sampler.sampling_gaps(pre.logits, out, r.seed, r.temperature)
            sampling_ok = bool((gaps <= cfg.sampling_tolerance).all())
            if not sampling_ok:
                reasons.append(f"sampling: {int((gaps > cfg.sampling_tolerance).sum())} tokens not reproduced by seed")
            lp = sampler.token_logprobs(pre.logits, out, r.temperature)
            claimed = torch.tensor(r.output_logprobs, dtype=torch.float32)
            logprobs_ok = claimed.shape == lp.shape and bool(((claimed - lp).abs() <= cfg.logprob_tolerance).all())
            if not logprobs_ok:
                reasons.append("logprobs: claimed logprobs differ from the recomputed ones")
            ends_eos = r.output_tokens[-1] == eos_token_id
            if ends_eos:
                termination_ok = float(lp[-1]) >= cfg.min_eos_logprob
            else:
                termination_ok = len(r.output_tokens) == max_new_tokens
            if not termination_ok:
                reasons.append("termination: neither a likely EOS nor the maximum length")
            if eos_token_id in r.output_tokens[:-1]:
                termination_ok = False
                reasons.append("termination: tokens after EOS")
            results.append(
                RolloutCheck(
                    row=start + offset,
                    passed=not reasons,
                    toploc=verdict.passed,
                    sampling=sampling_ok,
                    logprobs=logprobs_ok,
                    termination=termination_ok,
                    reasons=reasons,
                )
            )
    return results
