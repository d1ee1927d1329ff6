"""Arithmetic over GF(65497), vectorised over many chunks at once.

Every function takes 2-D int64 arrays shaped [chunks, points] and processes all chunks in one
go: a few dozen vector steps and batched matmuls, never a loop over chunks or points.  The
arithmetic runs in float64, which is exact here: residues are below 2**16, products below
2**32, and no sum of products reaches 2**53.
"""

from __future__ import annotations

import threading
from functools import cache

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

P = 65497  # the field prime of the reference format
_MODULUS_BLOCK = 64  # candidate moduli tried per vector step of the modulus search
_INV_P = 1.0 / P
_local = threading.local()  # scratch buffers of `_reduce`, one per thread


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


def _reduce(values: np.ndarray) -> np.ndarray:
    """values mod p for integer-valued float64 arrays below 2**45, in place, result in [0, p].

    floor(v / p) from a float product is exact except when v is a multiple of p, where it may
    come out one low and leave p instead of 0: harmless inside a computation (every bound below
    allows values up to p), and `_to_residues` maps it to 0 at the end. Floats because float64
    matmuls (BLAS) are exact while sums of products stay below 2**53, and these vector ops beat
    int64 `%`; the quotient goes to a reused per-thread buffer because fresh multi-megabyte
    temporaries cost more in page faults than the arithmetic.
    """
    quotient = _scratch(values.size).reshape(values.shape)
    np.multiply(values, _INV_P, out=quotient)
    np.floor(quotient, out=quotient)
    quotient *= P
    values -= quotient
    return values


def _scratch(size: int) -> np.ndarray:
    buffer = getattr(_local, "buffer", None)
    if buffer is None or buffer.size < size:
        buffer = _local.buffer = np.empty(size, dtype=np.float64)
    return buffer[:size]


def _to_residues(values: np.ndarray) -> np.ndarray:
    out = values.astype(np.int64)
    out[out == P] = 0
    return out


def _powers(x: np.ndarray, count: int) -> np.ndarray:
    """[rows, count, k] float64: x^0 .. x^(count-1) mod p of x [rows, k] (float64 residues)."""
    powers = np.empty((x.shape[0], count, x.shape[1]), dtype=np.float64)
    powers[:, 0] = 1.0
    for e in range(1, count):
        np.multiply(powers[:, e - 1], x, out=powers[:, e])
        _reduce(powers[:, e])
    return powers


def _block_size(rows: int, n: int) -> int:
    # ~sqrt(n) vector steps either side of the matmul; fewer Python steps when rows are few.
    return max(1, min(n, 16 if rows < 64 else 8))


def _power_sums(weights: np.ndarray, x: np.ndarray, count: int) -> np.ndarray:
    """S[row, s] = sum_i weights[row, i] * x[row, i]^s mod p for s < count (float64 in [0, p]).

    s = b*q + r: one batched matmul of (w x^r) [rows, b, k] with (x^b)^q [rows, k, n/b].
    """
    rows, k = x.shape
    block = _block_size(rows, count)
    blocks = -(-count // block)
    low = _powers(x, block + 1)
    high = _powers(low[:, block].copy(), blocks)  # (x^b)^q
    weighted = _reduce(low[:, :block] * weights[:, None, :])
    sums = _reduce(np.matmul(weighted, high.transpose(0, 2, 1)))  # [rows, r, q], each < k p^2
    return sums.transpose(0, 2, 1).reshape(rows, blocks * block)[:, :count]


def _from_roots(x: np.ndarray) -> np.ndarray:
    """Coefficients (ascending, float64 [rows, n + 1]) of prod_i (X - x_i) per row, by a product tree.

    Groups of 8 linear factors are multiplied out step by step; then pairs of polynomials are
    multiplied as one batched matmul per tree level (a Toeplitz view of one factor against the
    other: exact, since at most 65 products below p^2 are summed).
    """
    rows, n = x.shape
    group = 8
    count = 1 << max(0, (-(-n // group) - 1).bit_length())  # groups, a power of two
    real = np.zeros((rows, count * group), dtype=bool)
    real[:, :n] = True
    roots = np.zeros((rows, count * group))
    roots[:, :n] = x
    # Factor i is a_i X + b_i: X - x_i for a point, the constant 1 for padding.
    a = real.astype(np.float64).reshape(rows, count, group)
    b = np.where(real, P - roots, 1.0).reshape(rows, count, group)
    polys = np.zeros((rows, count, group + 1))
    polys[..., 0] = 1.0
    for i in range(group):
        step = polys * b[..., i : i + 1]
        step[..., 1:] += polys[..., :-1] * a[..., i : i + 1]
        polys = _reduce(step)
    while polys.shape[1] > 1:
        left, right = polys[:, 0::2], polys[:, 1::2]
        length = left.shape[-1]
        degree = length - 1
        padded = np.zeros(right.shape[:-1] + (3 * degree + 1,))
        padded[..., degree : degree + length] = right
        windows = sliding_window_view(padded, length, axis=-1)  # [.., 2d+1, d+1]: padded[j + t]
        # product_j = sum_t right[j + t - d] * left[d - t]
        polys = _reduce(np.einsum("cgjt,cgt->cgj", windows, left[..., ::-1]))
    return polys[:, 0, : n + 1]


def interpolate(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Monomial coefficients (ascending) of the polynomial through (x, y) per row, over GF(p).

    Lagrange form with the master polynomial M = prod (X - x_i):
    f = sum_i w_i M / (X - x_i), w_i = y_i / M'(x_i), so coefficient k of f is
    sum_s M[k + 1 + s] * S_s with power sums S_s = sum_i w_i x_i^s.  Every stage is a few vector
    steps and batched matmuls over all rows at once (no loop over the n points).
    x must hold distinct residues per row; any x < p works.  Shapes: [rows, n] -> [rows, n].
    """
    x = np.asarray(x, dtype=np.int64) % P
    y = np.asarray(y, dtype=np.int64) % P
    rows, n = x.shape
    if n == 0 or rows == 0:
        return np.zeros((rows, n), dtype=np.int64)
    xf = x.astype(np.float64)
    master = _from_roots(xf)  # [rows, n + 1], monic
    derivative = _reduce(master[:, 1:] * np.arange(1, n + 1, dtype=np.float64))
    denominators = evaluate(_to_residues(derivative), x)  # M'(x_i), non-zero for distinct x
    weights = _reduce(y * inverse_table()[denominators].astype(np.float64))
    sums = _power_sums(weights, xf, n)
    shifted = np.zeros((rows, 2 * n))
    shifted[:, :n] = master[:, 1:]
    hankel = sliding_window_view(shifted, n, axis=1)[:, :n]  # [rows, k, s] = M[k + 1 + s]
    return _to_residues(_reduce(np.einsum("cks,cs->ck", hankel, sums)))


def evaluate(coeffs: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per row: the polynomial coeffs [rows, n] (ascending) at points x [rows, k] -> [rows, k], mod p.

    Blocked: degree j = b*q + r, so value = sum_q (x^b)^q * sum_r c[bq + r] x^r. The inner sums for
    all blocks are one batched float64 matmul (exact: b products below p^2 stay far below 2**53),
    the outer sum a Horner pass over n/b blocks: about b + n/b vector steps instead of n.
    Coefficients may be >= p (any u16 from a proof): the result is still mod p.
    """
    coeffs = np.asarray(coeffs, dtype=np.int64)
    x = np.asarray(x, dtype=np.int64) % P
    rows, n = coeffs.shape
    if n == 0 or x.size == 0:
        return np.zeros(x.shape, dtype=np.int64)
    block = _block_size(rows, n)
    blocks = -(-n // block)
    padded = np.zeros((rows, blocks * block), dtype=np.float64)
    padded[:, :n] = coeffs
    powers = _powers(x.astype(np.float64), block + 1)  # [rows, b + 1, k]
    x_block = powers[:, block]
    # inner[row, q, point] = sum_r c[bq + r] x^r
    inner = _reduce(np.matmul(padded.reshape(rows, blocks, block), powers[:, :block]))
    result = inner[:, blocks - 1].copy()
    for q in range(blocks - 2, -1, -1):
        result *= x_block
        result += inner[:, q]
        _reduce(result)
    return _to_residues(result)
