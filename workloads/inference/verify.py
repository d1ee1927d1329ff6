"""Recompute-and-check of rollouts, the validator's view of a file: one batched prefill over
prompt + output, then per row TOPLOC, sampling reproduction from the seed, logprob consistency and
termination. Lives here, next to the generator, so both sides share one definition of positions,
seeds and logprobs; the validator service calls it."""

from __future__ import annotations

import itertools
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


# Vocabulary entries one step of `token_checks` holds (float32 logits, float64 and int64 noise
# temporaries): 2^25 is about 1 GB of temporaries, a few hundred tokens at a real vocabulary size.
TOKEN_CHECK_ENTRIES = 1 << 25


def token_checks(
    rows: list[Rollout], recomputed: list[PrefillResult], max_entries: int = TOKEN_CHECK_ENTRIES
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Sampling gaps and logprobs of every output token of a chunk of rows, in one vectorised pass
    (per-row small tensor ops would cost more than the prefill itself), on the device the logits are
    on (the model's), returned on the CPU.

    Tokens go through in slices of at most `max_entries` logits: 64 rows x 1,024 tokens of a
    151,936-entry vocabulary would be 40 GB as float32 at once, and as much again of noise. A slice
    computes exactly what the whole would, token by token (the shipped model's files fit in one)."""
    lengths = [len(r.output_tokens) for r in rows]
    if not rows or not sum(lengths):
        empty = torch.zeros(0)
        return [empty for _ in rows], [empty for _ in rows]
    vocab, device = recomputed[0].logits.shape[-1], recomputed[0].logits.device
    tokens = [t for r in rows for t in r.output_tokens]
    temps = [r.temperature for r, n in zip(rows, lengths, strict=True) for _ in range(n)]
    seeds = [r.seed for r, n in zip(rows, lengths, strict=True) for _ in range(n)]
    positions = [i for n in lengths for i in range(n)]
    per_slice = max(1, max_entries // vocab)
    starts = [0, *itertools.accumulate(lengths)][:-1]  # each row's first token in the flat order
    gaps_out, logprobs_out = [], []
    for lo in range(0, len(tokens), per_slice):
        hi = min(len(tokens), lo + per_slice)
        parts = [p.logits[max(lo - s, 0) : hi - s] for p, s in zip(recomputed, starts, strict=True)
                 if s < hi and s + p.logits.shape[0] > lo]  # fmt: skip
        gaps, logprobs = _slice_checks(torch.cat(parts), tokens[lo:hi], temps[lo:hi], seeds[lo:hi],
                                       positions[lo:hi], device)  # fmt: skip
        gaps_out.append(gaps.cpu())
        logprobs_out.append(logprobs.cpu())
    return list(torch.cat(gaps_out).split(lengths)), list(torch.cat(logprobs_out).split(lengths))


def _slice_checks(
    logits: torch.Tensor, tokens: list[int], temps: list[float], seeds: list[int], positions: list[int],
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    logits = logits.float()
    token_ids = torch.tensor(tokens, device=device).view(-1, 1)
    temperatures = torch.tensor(temps, device=device)
    sampled = temperatures > 0
    scaled = logits / torch.where(sampled, temperatures, torch.ones_like(temperatures)).view(-1, 1)
    noise = sampler.noise_matrix(seeds, positions, logits.shape[-1], device).to(device) * sampled.view(-1, 1)
    scores = scaled + noise
    gaps = scores.max(dim=-1).values - scores.gather(-1, token_ids).squeeze(-1)
    logprobs = torch.log_softmax(scaled, dim=-1).gather(-1, token_ids).squeeze(-1)
    return gaps, logprobs
