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


def noise_matrix(
    seeds: list[int], positions: list[int], vocab_size: int, device: torch.device | None = None
) -> torch.Tensor:
    """Gumbel noise [rows, vocab], float32, on `device` (default the CPU).

    On the CPU numpy computes it, as it always has. On a GPU the same hash runs there
    (`_noise_on_device`): a 151,936-entry vocabulary at batch 64 is 10 M hashes a decode step, which
    numpy on one core takes longer to make than the GPU takes for the whole step, and the copy would
    follow. Both give the same float32 noise (tested on the CPU, measured on a GPU by bench/gpu)."""
    if device is not None and device.type != "cpu":
        return _noise_on_device(seeds, positions, vocab_size, device)
    u = uniforms(seeds, positions, vocab_size)
    return torch.from_numpy(-np.log(-np.log(u))).float()


def _as_int64(value: np.uint64) -> int:
    """A uint64 constant as the int64 with the same bits (torch has no general uint64 arithmetic)."""
    return int(value) - (1 << 64) if int(value) >= 1 << 63 else int(value)


_G_I64, _M1_I64, _M2_I64 = _as_int64(_G), _as_int64(_M1), _as_int64(_M2)


def _shift_xor(z: torch.Tensor, bits: int) -> None:
    """z ^= z >> bits, a logical shift (int64 `>>` is arithmetic: mask off the copied sign bits)."""
    high = z >> bits
    high &= (1 << (64 - bits)) - 1
    z ^= high


def _mix_inplace(z: torch.Tensor) -> torch.Tensor:
    """`_mix` on int64 tensors: two's complement multiplication wraps exactly like uint64's."""
    _shift_xor(z, 30)
    z *= _M1_I64
    _shift_xor(z, 27)
    z *= _M2_I64
    _shift_xor(z, 31)
    return z


def _noise_on_device(
    seeds: list[int], positions: list[int], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """`noise_matrix` computed with torch on `device`: the hash in int64 (same bits as numpy's uint64),
    the 53 high bits to float64 exactly, then the same float64 logarithms, rounded to float32.
    In place where it can be: two [rows, vocab] int64 buffers at a time."""
    s = torch.tensor(np.asarray(seeds, dtype=np.int64), device=device)
    p = torch.tensor(np.asarray(positions, dtype=np.int64), device=device)
    key = _mix_inplace(_mix_inplace(s + _G_I64) ^ p)
    z = torch.arange(1, vocab_size + 1, dtype=torch.int64, device=device) * _G_I64
    z = _mix_inplace(key[:, None] + z[None, :])
    bits = ((z >> 11) & ((1 << 53) - 1)).to(torch.float64)
    del z
    u = (bits + 0.5) * 2.0**-53
    return u.log_().neg_().log_().neg_().float()


def gumbel_noise(seed: int, position: int, vocab_size: int) -> torch.Tensor:
    return noise_matrix([seed], [position], vocab_size)[0]


def scores(logits: torch.Tensor, seeds: list[int], positions: list[int], temperature: float) -> torch.Tensor:
    """Perturbed scores [rows, vocab] in float32; the sampled token is their argmax."""
    scaled = logits.float() / temperature if temperature > 0 else logits.float()
    if temperature <= 0:  # greedy: no noise
        return scaled
    return scaled + noise_matrix(seeds, positions, logits.shape[-1], logits.device).to(logits.device)


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
