"""Seeded Gumbel-max sampling: every token is a pure function of (seed, position, logits).

token = argmax(logits / temperature + g), g = -log(-log(u)), where u for vocabulary entry j of
output position p of a sequence with seed s is a counter-based hash, fully specified so any
implementation (a validator in another language, a GPU kernel) draws the same noise:

    mix(z)  = splitmix64 finaliser: z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27;
              z *= 0x94D049BB133111EB; z ^= z >> 31            (all uint64, wrapping)
    key     = mix(mix(s + G) ^ p)                              G = 0x9E3779B97F4A7C15
    u[j]    = ((mix(key + (j + 1) * G) >> 11) + 0.5) / 2**53   (in (0, 1), float64)

The noise depends only on the sequence's own seed and the token's position, never on the batch it
was decoded in, and it is vectorised (no per-row generator objects), so a validator reproduces the
tokens of a whole file from one prefill's logits at negligible cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_G = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    z = z ^ (z >> np.uint64(30))
    z = z * _M1
    z = z ^ (z >> np.uint64(27))
    z = z * _M2
    return z ^ (z >> np.uint64(31))


def uniforms(seeds: list[int], positions: list[int], vocab_size: int) -> np.ndarray:
    """u[rows, vocab] in (0, 1), float64, for the (seed, position) of each row."""
    with np.errstate(over="ignore"):
        s = np.asarray(seeds, dtype=np.int64).astype(np.uint64)
        p = np.asarray(positions, dtype=np.int64).astype(np.uint64)
        key = _mix(_mix(s + _G) ^ p)
        j = np.arange(1, vocab_size + 1, dtype=np.uint64) * _G
        bits = _mix(key[:, None] + j[None, :]) >> np.uint64(11)
    return (bits.astype(np.float64) + 0.5) * 2.0**-53


def noise_matrix(seeds: list[int], positions: list[int], vocab_size: int) -> torch.Tensor:
    """Gumbel noise [rows, vocab], float32."""
    u = uniforms(seeds, positions, vocab_size)
    return torch.from_numpy(-np.log(-np.log(u))).float()


def gumbel_noise(seed: int, position: int, vocab_size: int) -> torch.Tensor:
    return noise_matrix([seed], [position], vocab_size)[0]


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


@dataclass(frozen=True)
class ReplayLimits:
    """How far below the seed's Gumbel maximum an honest token can replay.

    Decode (batched, KV cache, left padding) and a validator's prefill round bf16 differently, so
    where the two best perturbed scores of a position are nearly tied the replay can put the other
    one first. On trained checkpoints that happens to about one token in tens of thousands, by up
    to a few tenths (`bench/sampling_calibration.py`, docs/validator.md). So: a token beyond `cap`
    is never honest; a row may hold `per_row` tokens beyond `near_tie` (a near tie), no more. A
    cheat that swaps in the runner-up gains at most that one token a row, within `cap`."""

    near_tie: float = 0.2
    cap: float = 1.0
    per_row: int = 1


def replay_fault(gaps: torch.Tensor, limits: ReplayLimits) -> str | None:
    """Why one row's tokens are not the seed's draws (None when they are), from its gaps."""
    if gaps.numel() == 0:
        return None
    worst = float(gaps.max())
    if worst > limits.cap:
        return f"a token {worst:.2f} below the seed's Gumbel maximum (honest near ties: up to {limits.cap})"
    ties = int((gaps > limits.near_tie).sum())
    if ties > limits.per_row:
        return (f"{ties} tokens more than {limits.near_tie} below the seed's Gumbel maximum "
                f"(honest: at most {limits.per_row})")
    return None
