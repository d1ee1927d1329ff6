"""The per-token replay of a recomputation: every claimed output token's Gumbel gap below the seed's
maximum and its recomputed logprob, from one prefill's logits, through the generator's own sampler
(`workloads.model.sampler`), so both sides share one definition of positions, seeds and logprobs. The
recomputation that runs it, with its rules and limits, is `model.py` `recompute` next to it: the
validator, the benches and the tests all run that one."""

from __future__ import annotations

import itertools

import torch

from workloads.model import sampler
from workloads.model.prefill import PrefillResult
from workloads.rollouts import Rollout

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
