"""Seeded Gumbel-max sampling: every token is a pure function of (seed, position, logits).

token = argmax(logits / temperature + g), g = -log(-log(u)), u ~ U[0, 1) from a torch CPU generator
seeded by mix(seed, position). A validator who recomputes the logits by one prefill draws the same
noise and gets the same token, so sampling can be checked instead of trusted. The noise does not
depend on the batch a sequence was decoded in, only on its own seed and the token's position.
"""

from __future__ import annotations

import hashlib

import torch

_EPS = 1e-20


def mix(seed: int, position: int) -> int:
    """Generator seed for (sequence seed, output position): first 8 bytes of blake2b, 63 bits."""
    digest = hashlib.blake2b(f"{int(seed)}:{int(position)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & (2**63 - 1)


def gumbel_noise(seed: int, position: int, vocab_size: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(mix(seed, position))
    u = torch.rand(vocab_size, generator=gen, dtype=torch.float32)
    return -torch.log(-torch.log(u.clamp_min(_EPS)))


def noise_matrix(seeds: list[int], positions: list[int], vocab_size: int) -> torch.Tensor:
    return torch.stack([gumbel_noise(s, p, vocab_size) for s, p in zip(seeds, positions, strict=True)])


def scores(logits: torch.Tensor, seeds: list[int], positions: list[int], temperature: float) -> torch.Tensor:
    """Perturbed scores [rows, vocab] in float32; the sampled token is their argmax."""
    scaled = logits.float() / temperature if temperature > 0 else logits.float()
    if temperature <= 0:  # greedy: no noise
        return scaled
    return scaled + noise_matrix(seeds, positions, logits.shape[-1]).to(logits.device)


def sample(
    logits: torch.Tensor, seeds: list[int], positions: list[int], temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of `logits` [rows, vocab]; returns (tokens, logprobs) where logprobs
    are under the temperature-scaled distribution (log_softmax(logits / T), T = 1 when greedy)."""
    tokens = scores(logits, seeds, positions, temperature).argmax(dim=-1)
    logprobs = token_logprobs(logits, tokens, temperature)
    return tokens, logprobs


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    t = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits.float() / t, dim=-1).gather(-1, tokens.view(-1, 1)).squeeze(-1)


def reproduce(logits: torch.Tensor, seed: int, temperature: float) -> torch.Tensor:
    """Validator side: the tokens one sequence's sampler picks from its recomputed logits [n, vocab]
    (row i predicts output token i)."""
    n = logits.shape[0]
    return scores(logits, [seed] * n, list(range(n)), temperature).argmax(dim=-1)


def sampling_gaps(logits: torch.Tensor, tokens: torch.Tensor, seed: int, temperature: float) -> torch.Tensor:
    """How far each claimed token's perturbed score is below the best one (0 where it is the argmax).

    Recomputed logits differ from decode-time ones by bf16 rounding, so a validator accepts gaps up
    to a small tolerance instead of demanding an exact argmax on near-ties."""
    n = logits.shape[0]
    s = scores(logits, [seed] * n, list(range(n)), temperature)
    return s.max(dim=-1).values - s.gather(-1, tokens.view(-1, 1)).squeeze(-1)
