"""Arithmetic over GF(65497), vectorised over many chunks at once.

Every function takes 2-D int64 arrays shaped [chunks, points] and loops only over the
polynomial degree (at most `topk` stages), never over elements.  Products stay below
65497**2 < 2**33, so int64 never overflows.
"""

from __future__ import annotations

from functools import cache

import numpy as np

P = 65497  # the field prime of the reference format
_MODULUS_BLOCK = 64  # candidate moduli tried per vector step of the modulus search


class ModulusNotFoundError(ValueError):
    """No modulus in [1, 65497] maps a chunk's indices to distinct residues."""


@cache
def inverse_table() -> np.ndarray:
    """inv[a] = a^(p-2) mod p for every a in [0, p); inv[0] = 0 (never used: points are distinct)."""
    base = np.arange(P, dtype=np.int64)
    result = np.ones(P, dtype=np.int64)
    exponent = P - 2
    while exponent:
        if exponent & 1:
            result = result * base % P
        base = base * base % P
        exponent >>= 1
    result[0] = 0
    result.flags.writeable = False
    return result


def injective_moduli(indices: np.ndarray) -> np.ndarray:
    """Per row, the largest m <= 65497 for which `indices % m` are pairwise distinct.

    Rows whose indices are all below 65497 take m = 65497 at once (common case); the rest are
    searched downwards in blocks of candidates, all pending rows together.
    """
    rows = indices.shape[0]
    moduli = np.zeros(rows, dtype=np.int64)
    if rows == 0:
        return moduli
    if indices.shape[1] <= 1:
        moduli[:] = P
        return moduli
    small = indices.max(axis=1) < P
    moduli[small] = P
    pending = np.flatnonzero(~small)
    top = P
    floor = indices.shape[1] - 1  # m < k points always collides (pigeonhole): stop there
    while pending.size and top > floor:
        candidates = np.arange(top, max(top - _MODULUS_BLOCK, floor), -1, dtype=np.int64)
        residues = np.sort(indices[pending][:, None, :] % candidates[None, :, None], axis=2)
        distinct = (residues[:, :, 1:] != residues[:, :, :-1]).all(axis=2)  # [pending, candidates]
        found = distinct.any(axis=1)
        moduli[pending[found]] = candidates[distinct[found].argmax(axis=1)]
        pending = pending[~found]
        top -= _MODULUS_BLOCK
    if pending.size:
        raise ModulusNotFoundError(f"no injective modulus for chunk(s) {pending.tolist()}")
    return moduli


def interpolate(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Monomial coefficients (ascending) of the polynomial through (x, y) per row, over GF(p).

    Newton divided differences, then expansion of the Newton form by a Horner-style pass.
    x must hold distinct residues per row; any x < p works.  Shapes: [rows, n] -> [rows, n].
    """
    x = np.asarray(x, dtype=np.int64) % P
    dd = np.asarray(y, dtype=np.int64) % P
    rows, n = dd.shape
    coeffs = np.zeros((rows, n), dtype=np.int64)
    if n == 0:
        return coeffs
    # inv_shifted[d + P] = 1 / d for d in (-P, P): differences index it without a reduction.
    inv = inverse_table()
    inv_shifted = np.concatenate([inv, inv])
    for level in range(1, n):
        # (dd[i] - dd[i-1] + P) * inv < 2 P^2 < 2^33: one reduction per level.
        step = (dd[:, level:] - dd[:, level - 1 : -1] + P) * inv_shifted[x[:, level:] - x[:, :-level] + P]
        dd[:, level:] = step % P
    # Expand dd[0] + dd[1](X-x0) + dd[2](X-x0)(X-x1) + ... from the innermost term outwards;
    # after stage i only the first n - i coefficients can be non-zero.
    minus_x = P - x
    coeffs[:, 0] = dd[:, n - 1]
    for i in range(n - 2, -1, -1):
        width = n - i  # degree of the running polynomial + 1
        lower = coeffs[:, : width - 1] * minus_x[:, i : i + 1]  # c_k * (-x_i)
        lower[:, 1:] += coeffs[:, : width - 2]  # + c_{k-1} (the X shift)
        lower[:, 0] += dd[:, i]
        coeffs[:, width - 1] = coeffs[:, width - 2]
        coeffs[:, : width - 1] = lower % P
    return coeffs


def evaluate(coeffs: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Horner evaluation per row: coeffs [rows, n] (ascending) at points x [rows, k] -> [rows, k]."""
    coeffs = np.asarray(coeffs, dtype=np.int64)
    x = np.asarray(x, dtype=np.int64) % P
    result = np.zeros(x.shape, dtype=np.int64)
    for j in range(coeffs.shape[1] - 1, -1, -1):
        result = (result * x + coeffs[:, j : j + 1]) % P
    return result
