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
from workloads.model.prefill import PrefillResult, prefill_batch
from workloads.model.sampler import ReplayLimits, replay_fault
from workloads.rollouts import Rollout
from workloads.toploc import ToplocThresholds, verify_proofs_batch


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
    replay: ReplayLimits = ReplayLimits()  # perturbed-score gaps allowed for bf16 recompute near-ties
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
    thresholds = cfg.toploc or ToplocThresholds()
    results: list[RolloutCheck] = []
    for start in range(0, len(rollouts), cfg.prefill_batch_size):
        chunk = rollouts[start : start + cfg.prefill_batch_size]
        # Prefill logits do not depend on temperature; it only rescales them below, per row.
        recomputed = prefill_batch(
            model, [r.input_tokens for r in chunk], [r.output_tokens for r in chunk], 1.0, pad_token_id
        )
        gaps, logprobs = token_checks(chunk, recomputed)
        # TOPLOC for every row at once: grouped top-k and one polynomial evaluation for all chunks.
        verdicts = verify_proofs_batch([p.hidden for p in recomputed], [r.proofs for r in chunk], thresholds)
        for offset, (r, verdict) in enumerate(zip(chunk, verdicts, strict=True)):
            reasons: list[str] = []
            if not verdict.passed:
                reasons.append(f"toploc: {verdict.reason}")
            fault = replay_fault(gaps[offset], cfg.replay)
            if fault:
                reasons.append(f"sampling: {fault}")
            lp = logprobs[offset]
            claimed = torch.tensor(r.output_logprobs, dtype=torch.float32)
            logprobs_ok = bool(((claimed - lp).abs() <= cfg.logprob_tolerance).all())
            if not logprobs_ok:
                reasons.append("logprobs: claimed logprobs differ from the recomputed ones")
            if r.output_tokens[-1] == eos_token_id:
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
                    sampling=fault is None,
                    logprobs=logprobs_ok,
                    termination=termination_ok,
                    reasons=reasons,
                )
            )
    return results


def token_checks(
    rows: list[Rollout], recomputed: list[PrefillResult]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Sampling gaps and logprobs of every output token of a chunk of rows, in one vectorised pass
    (per-row small tensor ops would cost more than the prefill itself)."""
    lengths = [len(r.output_tokens) for r in rows]
    logits = torch.cat([p.logits for p in recomputed]).float()
    tokens = torch.tensor([t for r in rows for t in r.output_tokens]).view(-1, 1)
    temps = torch.tensor([r.temperature for r, n in zip(rows, lengths, strict=True) for _ in range(n)])
    sampled = temps > 0
    scaled = logits / torch.where(sampled, temps, torch.ones_like(temps)).view(-1, 1)
    seeds = [r.seed for r, n in zip(rows, lengths, strict=True) for _ in range(n)]
    positions = [i for n in lengths for i in range(n)]
    noise = sampler.noise_matrix(seeds, positions, logits.shape[-1]) * sampled.view(-1, 1)
    scores = scaled + noise
    gaps = scores.max(dim=-1).values - scores.gather(-1, tokens).squeeze(-1)
    logprobs = torch.log_softmax(scaled, dim=-1).gather(-1, tokens).squeeze(-1)
    return list(gaps.split(lengths)), list(logprobs.split(lengths))
