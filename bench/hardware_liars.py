"""The liars of bench/hardware.py, section 3: each commits to something other than the challenge's
product (or to part of it) and answers the probe consistently with what it committed to, its best
play; `trial_run` counts how often `intellect.hardware.check` refuses one, and by which test."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from intellect import hardware
from intellect.hardware import ROWS_OPENED

LIAR_N = 128


def ids(rng: np.random.Generator) -> tuple[str, str, bytes]:
    """A challenge id, a node address and the challenger's secret."""
    return rng.bytes(32).hex(), "0x" + rng.bytes(20).hex(), rng.bytes(32)




Committed = tuple[str, list[float], list[list[float]], list[list[str]]]  # root, C·r, rows, proofs


Liar = Callable[[np.random.Generator, str, str, np.ndarray, np.ndarray, hardware.Probe], Committed]


def garbage(rng: np.random.Generator, shape: tuple[int, ...], n: int) -> np.ndarray:
    """Values spread like C's entries (each a sum of n products of U(-1, 1): variance n / 9)."""
    return (rng.standard_normal(shape) * math.sqrt(n / 9)).astype(np.float32)


def consistent(c: np.ndarray, p: hardware.Probe) -> Committed:
    levels = hardware.merkle_levels(c)
    return (levels[-1][0].hex(), *hardware.answer(c, levels, p))


def exact_cr(a: np.ndarray, b: np.ndarray, p: hardware.Probe) -> list[float]:
    return (a.astype(np.float64) @ (b.astype(np.float64) @ p.vector)).tolist()


def moved_entry(relative: float) -> Liar:
    def liar(rng, challenge_id, node, a, b, p):  # noqa: ANN001, ANN202
        c = hardware.multiply(a, b, "float32")
        i, j = (int(x) for x in rng.integers(c.shape[0], size=2))
        scale = float(np.abs(a[i]).astype(np.float64) @ np.abs(b[:, j]).astype(np.float64))
        c[i, j] = np.float32(float(c[i, j]) + relative * scale)
        return consistent(c, p)

    return liar


def garbage_c(rng, challenge_id, node, a, b, p):  # noqa: ANN001, ANN201
    return consistent(garbage(rng, a.shape, a.shape[0]), p)


def other_challenge(rng, challenge_id, node, a, b, p):  # noqa: ANN001, ANN201
    return consistent(hardware.multiply(*hardware.matrices(rng.bytes(32).hex(), node, a.shape[0], "float32"),
                                        "float32"), p)  # fmt: skip


def other_node(rng, challenge_id, node, a, b, p):  # noqa: ANN001, ANN201
    other = "0x" + rng.bytes(20).hex()
    return consistent(hardware.multiply(*hardware.matrices(challenge_id, other, a.shape[0], "float32"),
                                        "float32"), p)  # fmt: skip


def cheap(rng, challenge_id, node, a, b, p):  # noqa: ANN001, ANN201
    root, _, rows, proofs = consistent(garbage(rng, a.shape, a.shape[0]), p)
    return root, exact_cr(a, b, p), rows, proofs


def cheap_true_rows(rng, challenge_id, node, a, b, p):  # noqa: ANN001, ANN201
    root, _, _, proofs = consistent(garbage(rng, a.shape, a.shape[0]), p)
    rows = [(a[i] @ b).astype(np.float64).tolist() for i in p.rows]  # computed once the probe is known
    return root, exact_cr(a, b, p), rows, proofs


def partial(fraction: float) -> Liar:
    def liar(rng, challenge_id, node, a, b, p):  # noqa: ANN001, ANN202
        n = a.shape[0]
        c = garbage(rng, a.shape, n)
        right = rng.choice(n, size=round(fraction * n), replace=False)
        c[right] = a[right] @ b
        root, _, rows, proofs = consistent(c, p)
        return root, exact_cr(a, b, p), rows, proofs

    return liar


def lower_precision(precision: str) -> Liar:
    def liar(rng, challenge_id, node, a, b, p):  # noqa: ANN001, ANN202
        low = hardware.multiply(hardware.round_to(a, precision), hardware.round_to(b, precision), precision)
        return consistent(low, p)

    return liar


REASONS = (("freivalds", "Freivalds"), ("Merkle proof", "Merkle"), ("its product with r", "row·r"),
           ("times B", "row ≠ A·B"))  # fmt: skip


def trial_run(liar: Liar, trials: int, rng: np.random.Generator, n: int = LIAR_N) -> dict[str, Any]:
    """How often `check` refuses the liar, and by which test (a trial counts once per test it fails)."""
    caught = 0
    by = {label: 0 for _, label in REASONS}
    least = math.inf
    for _ in range(trials):
        challenge_id, node, secret = ids(rng)
        a, b = hardware.matrices(challenge_id, node, n, "float32")
        p = hardware.probe(secret, n)
        root, cr, rows, proofs = liar(rng, challenge_id, node, a, b, p)
        result = hardware.check(a, b, "float32", root, p, cr, rows, proofs)
        if not result.ok:
            caught += 1
            for key, label in REASONS:
                by[label] += any(key in reason for reason in result.reasons)
            if result.worst > 1.0:  # a refusal by a Merkle proof alone has no error ratio
                least = min(least, result.worst)
    return {"trials": trials, "caught": caught, "by": by,
            "least_worst_caught": None if math.isinf(least) else least}  # fmt: skip


def hypergeometric(right: int, n: int, opened: int = ROWS_OPENED) -> float:
    opened = min(opened, n)
    return math.comb(right, opened) / math.comb(n, opened)
