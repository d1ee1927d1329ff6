"""GF(65497) arithmetic against plain-Python definitions."""

from __future__ import annotations

import numpy as np
import pytest

from workloads.toploc.field import ModulusNotFoundError, P, evaluate, injective_moduli, interpolate


def lagrange_coeffs(xs: list[int], ys: list[int]) -> list[int]:
    """Monomial coefficients by textbook Lagrange interpolation with Python ints."""
    n = len(xs)
    out = [0] * n
    for i in range(n):
        basis = [1]  # prod_{j != i} (X - x_j) / (x_i - x_j)
        denom = 1
        for j in range(n):
            if j == i:
                continue
            basis = [(a - xs[j] * b) % P for a, b in zip([0] + basis, basis + [0], strict=True)]
            denom = denom * (xs[i] - xs[j]) % P
        scale = ys[i] * pow(denom, P - 2, P) % P
        out = [(o + scale * b) % P for o, b in zip(out, basis, strict=True)]
    return out


def slow_modulus(indices: list[int]) -> int:
    return next(m for m in range(P, 0, -1) if len({i % m for i in indices}) == len(indices))


@pytest.mark.parametrize("n", [1, 2, 5, 17])
def test_interpolation_matches_lagrange(n: int) -> None:
    rng = np.random.default_rng(n)
    x = np.stack([rng.choice(P, n, replace=False) for _ in range(3)])
    y = rng.integers(0, 65536, (3, n))  # bf16 bit patterns: some exceed p and must wrap
    coeffs = interpolate(x, y)
    for row in range(3):
        assert coeffs[row].tolist() == lagrange_coeffs(x[row].tolist(), (y[row] % P).tolist())


def test_full_size_polynomial_passes_through_its_points() -> None:
    rng = np.random.default_rng(7)
    x = np.stack([rng.choice(60000, 128, replace=False) for _ in range(8)])
    y = rng.integers(0, 65536, (8, 128))
    coeffs = interpolate(x, y)
    assert coeffs.shape == (8, 128) and coeffs.min() >= 0 and coeffs.max() < P
    assert (evaluate(coeffs, x) == y % P).all()
    # and not through other points (a degree-127 polynomial is not constant-ish)
    assert (evaluate(coeffs, (x + 1) % P) != y % P).mean() > 0.95


def test_modulus_search_matches_the_definition() -> None:
    rng = np.random.default_rng(3)
    rows = [
        rng.choice(30000, 128, replace=False),  # all below p: m = p
        np.concatenate([[100, 100 + P, 5, 5 + 2 * (P - 1)], rng.choice(120000, 124, replace=False) + 200000]),
        rng.choice(131072, 128, replace=False),
    ]
    got = injective_moduli(np.stack(rows).astype(np.int64))
    assert got.tolist() == [slow_modulus(r.tolist()) for r in rows]
    assert got[0] == P and got[1] < P


def test_modulus_search_reports_impossible_rows() -> None:
    # 0..P are P + 1 distinct indices: no m <= P keeps them distinct (pigeonhole).
    with pytest.raises(ModulusNotFoundError):
        injective_moduli(np.arange(P + 1, dtype=np.int64)[None, :])
