"""Proof of hardware: a matrix product the node must compute and the challenger checks cheaply.

The challenger (the orchestrator before it invites a node, and again at random times) sends a
challenge: an id it drew at random, a size `n` and a precision. Both sides derive the seed from
(challenge id, node address), so an answer is bound to that node and that moment: it cannot be
reused for another node or replayed later. From the seed both build the same A and B (n × n, entries
uniform in [-1, 1) rounded to the precision); the node computes C = A·B and answers with a Merkle
root over C's rows (each row's float32 bytes). Only then does the challenger reveal its probe: a
random ±1 vector r and a few row indexes, drawn from a secret it kept until the commitment arrived.
The node returns C·r and the asked rows with their Merkle proofs, and the challenger checks

- **Freivalds**: C·r against A·(B·r), O(n²) for the challenger against the node's O(n³);
- **the rows**: each against the root (the node committed to it before it knew which), against the
  claimed C·r (row · r), and against A's row times B (O(n²) each).

A node that committed a C it did not compute in full is caught on every opened row it skipped: with
a fraction f of C's rows computed, the chance of passing is at most f^k for k opened rows
(`ROWS_OPENED`: 64, so a node that computed 90 % of the rows passes one challenge 1 time in 850, and
a node that committed and then does not open counts as failed: orchestrator/hardware/challenger.py).
The time from sending the challenge to receiving the commitment, as the challenger's clock sees it,
bounds the time the node needed (a round trip included, nothing subtracted), so 2n³ over it bounds
its sustained FLOP/s for that precision: a node can prove less than it has (then it is placed by what
it proved); more only by having someone faster compute for it (a relay), which no time bound tells
apart (docs/hardware.md has the measured factors).

Tolerances follow how float error grows, per precision: u times the value plus u times the root sum
of squares of its terms (`_allowed`, × a margin). Honest float error is far below them (measured:
`bench/hardware.py`, docs/hardware.md); a wrong product is off by the size of the values themselves.

This module needs numpy only; torch computes a GPU node's product, imported inside the function that
does it.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

PRECISIONS = ("float32", "float16", "bfloat16")
ROWS_OPENED = 64  # rows opened per challenge (min(64, n)): a 90 %-computed C passes with 0.9⁶⁴ ≈ 0.1 %
MAX_N = 8192  # 8192² float32 = 256 MiB per matrix: the largest challenge a node must hold
DOMAIN = b"intellect-hardware/1"

# Unit roundoff of each precision's result (C is rounded to it before it is widened to float32) and of
# the accumulation (fp32 on tensor cores and CPUs; a GPU allowed reduced-precision fp16 reductions
# accumulates in the result's own precision, hence the result's roundoff enters the bound too).
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
# Half the spacing of the precision's subnormals: a result that small is rounded by up to this much
# whatever its size (float16 only in practice: the others' subnormals are below 1e-38).
SUBNORMAL_ROUNDOFF = {"float32": 2.0**-150, "float16": 2.0**-25, "bfloat16": 2.0**-134}
# The margin over the rounding model (`_allowed`), from honest answers (docs/hardware.md, bench/hardware.py):
# honest errors reach a small fraction of the allowance; a wrong entry is off by the entry's own size,
# about 1/(2·margin·u) allowances: 16 in bf16, 128 in fp16, thousands in fp32 (n·u₃₂ bounds it there).
TOLERANCE_FACTOR = 8.0


class ChallengeError(ValueError):
    """A challenge or an answer that is malformed (a size out of range, a proof of the wrong shape)."""


def challenge_seed(challenge_id: str, node_address: str) -> int:
    """The seed of A and B: (challenge id, node) so that no answer serves another node or time."""
    digest = hashlib.sha256(DOMAIN + b":seed:" + challenge_id.encode() + b":" + node_address.lower().encode())
    return int.from_bytes(digest.digest(), "big")


def round_to(values: np.ndarray, precision: str) -> np.ndarray:
    """float32 values rounded to `precision` (to nearest, ties to even), returned as float32."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    if precision == "float32":
        return x
    if precision == "float16":
        return x.astype(np.float16).astype(np.float32)
    if precision == "bfloat16":
        bits = x.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return rounded.astype(np.uint32).view(np.float32)
    raise ChallengeError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")


def check_size(n: int, precision: str) -> None:
    if not 1 <= n <= MAX_N:
        raise ChallengeError(f"size {n}: a challenge's n is between 1 and {MAX_N}")
    if precision not in PRECISIONS:
        raise ChallengeError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")


def matrices(challenge_id: str, node_address: str, n: int, precision: str) -> tuple[np.ndarray, np.ndarray]:
    """A and B of a challenge (float32 arrays holding values exact in `precision`)."""
    check_size(n, precision)
    rng = np.random.default_rng(challenge_seed(challenge_id, node_address))
    a = rng.uniform(-1.0, 1.0, (n, n)).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, (n, n)).astype(np.float32)
    return round_to(a, precision), round_to(b, precision)


def multiply(a: np.ndarray, b: np.ndarray, precision: str, device: str = "cpu") -> np.ndarray:
    """The node's product C = A·B in `precision`, widened to float32 (what its rows' bytes are).

    On the CPU through numpy: float32 sums (BLAS), the result rounded to `precision` (what a CPU
    without the type does; and the worker's daemon never imports torch). On a GPU (`cuda`, `cuda:N`)
    through torch in `precision` (tensor cores for the 16-bit types)."""
    if device == "cpu":
        return round_to(a @ b, precision)
    import torch

    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[precision]
    ta = torch.from_numpy(a).to(device=device, dtype=dtype)
    tb = torch.from_numpy(b).to(device=device, dtype=dtype)
    return (ta @ tb).to(torch.float32).cpu().numpy()


# --- the commitment: a Merkle tree over C's rows -------------------------------------------------------


def _leaf(row: np.ndarray) -> bytes:
    return hashlib.sha256(b"\x00" + np.ascontiguousarray(row, dtype=np.float32).tobytes()).digest()


def _parent(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def merkle_levels(c: np.ndarray) -> list[list[bytes]]:
    """Every level of the tree over C's rows, leaves first; an odd node is carried up unchanged."""
    level = [_leaf(row) for row in c]
    levels = [level]
    while len(level) > 1:
        level = [_parent(level[i], level[i + 1]) if i + 1 < len(level) else level[i]
                 for i in range(0, len(level), 2)]  # fmt: skip
        levels.append(level)
    return levels


def merkle_proof(levels: list[list[bytes]], index: int) -> list[str]:
    """Sibling hashes from the leaf up (hex; "" where the node had no sibling and was carried up)."""
    proof = []
    for level in levels[:-1]:
        sibling = index ^ 1
        proof.append(level[sibling].hex() if sibling < len(level) else "")
        index //= 2
    return proof


def verify_proof(root: str, row: np.ndarray, index: int, proof: list[str]) -> bool:
    node = _leaf(row)
    for sibling in proof:
        if sibling:
            try:
                other = bytes.fromhex(sibling)
            except ValueError:
                return False
            node = _parent(other, node) if index & 1 else _parent(node, other)
        elif index & 1:  # a right child always has a sibling
            return False
        index //= 2
    return node.hex() == root


# --- the probe the challenger keeps secret until the commitment ------------------------------------------


@dataclass(frozen=True)
class Probe:
    vector: np.ndarray  # ±1, length n
    rows: list[int]  # distinct row indexes to open


def probe(secret: bytes, n: int, opened: int = ROWS_OPENED) -> Probe:
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(DOMAIN + b":probe:" + secret).digest(), "big"))
    vector = rng.choice(np.asarray([-1.0, 1.0], dtype=np.float64), n)
    rows = sorted(int(i) for i in rng.choice(n, size=min(opened, n), replace=False))
    return Probe(vector=vector, rows=rows)


Reveal = tuple[list[float], list[list[float]], list[list[str]]]  # C·r, the opened rows, their proofs


def answer(c: np.ndarray, levels: list[list[bytes]], p: Probe) -> Reveal:
    """The node's reveal: C·r (float64 sums of its float32 C), the asked rows and their proofs."""
    cr = (c.astype(np.float64) @ p.vector).tolist()
    rows = [c[i].astype(np.float64).tolist() for i in p.rows]
    return cr, rows, [merkle_proof(levels, i) for i in p.rows]


# --- the check ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    ok: bool
    reasons: list[str]
    worst: float  # the largest error seen as a fraction of its tolerance (honest answers: well below 1)


def _allowed(precision: str, n: int, magnitude: np.ndarray, spread: np.ndarray, terms: int = 1) -> np.ndarray:
    """The honest error allowed where the exact value has size `magnitude` and its terms' root sum
    of squares is `spread`: the result rounded to the precision (u·|value|), partial sums rounded to
    it (u·spread, for a GPU's split reductions), float32 sums (n·u₃₂·spread: BLAS's blocked sums were
    measured past √n·u₃₂·spread), the rounding of `terms` subnormal results, × the margin."""
    u = UNIT_ROUNDOFF[precision]
    model = (u * (magnitude + spread) + n * UNIT_ROUNDOFF["float32"] * spread
             + terms * SUBNORMAL_ROUNDOFF[precision])
    return np.asarray(TOLERANCE_FACTOR * model, dtype=np.float64)


def check(a: np.ndarray, b: np.ndarray, precision: str, root: str, p: Probe, cr: list[float],
          rows: list[list[float]], proofs: list[list[str]]) -> Check:  # fmt: skip
    """Judge a reveal against the commitment `root`. Every reason is a fact anyone holding the
    challenge, the commitment and the reveal can recompute (a wrong answer is evidence).

    Tolerances follow how float error grows: an entry's error is of the order of u times the root
    sum of squares of its n terms (random signs cancel), not u times the sum of their sizes (the
    worst case, n/√n times larger: at n = 64 in bf16 it let a wholly wrong product through)."""
    n = a.shape[0]
    reasons: list[str] = []
    if len(cr) != n or len(rows) != len(p.rows) or len(proofs) != len(p.rows):
        return Check(False, [f"answer shape: C·r of {len(cr)} (want {n}), {len(rows)} rows and {len(proofs)} "
                             f"proofs (want {len(p.rows)})"], math.inf)  # fmt: skip
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    a_sq, b_sq = a64 * a64, b64 * b64
    claimed = np.asarray(cr, dtype=np.float64)
    exact = a64 @ (b64 @ p.vector)
    # (C·r)_i = Σ_j c_ij r_j: its error is the random-sign sum of the entries' errors, whose root sum of
    # squares is that of the entries' sizes (Σ_j c_ij² ≈ Σ_j Σ_k a_ik² b_kj²) over u: both terms at once
    spread = np.sqrt(a_sq @ b_sq.sum(axis=1))
    allowed = _allowed(precision, n, spread, spread, terms=n) + 1e-300
    finite = bool(np.all(np.isfinite(claimed)))
    ratio = np.abs(claimed - exact) / allowed if finite else np.full(n, math.inf)
    worst = float(np.max(ratio)) if n else 0.0
    if worst > 1.0:
        bad = int(np.argmax(ratio))
        reasons.append(f"freivalds: C·r is not A·(B·r) (entry {bad} off by {worst:.3g} × its tolerance)")
    opened: list[tuple[int, np.ndarray]] = []
    for index, values, proof in zip(p.rows, rows, proofs, strict=True):
        row = np.asarray(values, dtype=np.float64)
        if row.shape != (n,) or not np.all(np.isfinite(row)):
            reasons.append(f"row {index}: {row.shape[0] if row.ndim else 0} values, want {n} finite ones")
            continue
        as32 = row.astype(np.float32)
        if not np.array_equal(as32.astype(np.float64), row) or not verify_proof(root, as32, index, proof):
            reasons.append(f"row {index}: not the row committed to (Merkle proof against the root fails)")
            continue
        if not finite or abs(float(row @ p.vector) - float(claimed[index])) > allowed[index]:
            reasons.append(f"row {index}: its product with r is not the answer's C·r entry {index}")
        opened.append((index, row))
    if opened:  # the opened rows' A·B in one product: O(k·n²)
        at = [i for i, _ in opened]
        exact_rows, spreads = a64[at] @ b64, np.sqrt(a_sq[at] @ b_sq)
        for (index, row), exact_row, row_spread in zip(opened, exact_rows, spreads, strict=True):
            allowed_row = _allowed(precision, n, np.abs(exact_row), row_spread) + 1e-300
            row_ratio = float(np.max(np.abs(row - exact_row) / allowed_row))
            worst = max(worst, row_ratio)
            if row_ratio > 1.0:
                reasons.append(f"row {index}: not A's row {index} times B (off by {row_ratio:.3g} × its "
                               "tolerance)")
    return Check(not reasons, reasons, worst)


def proven_flops(n: int, seconds: float) -> float:
    """The sustained FLOP/s a node proved: 2n³ multiply-adds over the time the challenger saw it take
    (one round trip included: nothing the node can inflate is subtracted)."""
    return 2.0 * n**3 / max(seconds, 1e-6)
