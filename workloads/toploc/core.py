"""Chunk-level proof building and measuring, batched over chunks of equal length.

A "block" is a 2-D bf16 tensor [chunks, length]: each row is one flattened chunk
(index = row-in-chunk x hidden + column), exactly what the reference proves.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from workloads.toploc.field import P, evaluate, injective_moduli, interpolate

NO_MATCH = float(2**64)  # the reference's mean/median when no exponent matches
_PARALLEL_MIN = 1 << 18  # elements: below this a thread pool costs more than it saves
_SLICE = 1 << 22  # elements per top-k call: bounded temporaries, and work to share among threads


def as_bf16(tensor: torch.Tensor) -> torch.Tensor:
    """Proofs commit to bf16 bit patterns; other float dtypes are rounded (round-to-nearest-even)."""
    if not tensor.is_floating_point():
        raise TypeError(f"activations must be a floating-point tensor, got {tensor.dtype}")
    return tensor if tensor.dtype == torch.bfloat16 else tensor.to(torch.bfloat16)


def top_points(
    block: torch.Tensor | Sequence[torch.Tensor], topk: int, parallel: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Indices and raw bf16 bits (0..65535) of the top-k |values| of each row.

    Same call as the reference (torch.topk on the bf16 absolute values), so ties and NaNs
    (which torch ranks above everything) select the same elements.  k = min(topk, length).
    A list of blocks of equal width counts as their rows stacked in order (without copying them
    into one tensor).  Work goes in slices of at most `_SLICE` elements, which keeps the |x|
    temporaries cache-sized; with `parallel` the slices are spread over threads (see
    `_run_slices`; only where no other torch work runs in the process).
    """
    blocks = [block] if isinstance(block, torch.Tensor) else list(block)
    rows = sum(b.shape[0] for b in blocks)
    k = min(topk, blocks[0].shape[1]) if blocks else 0
    if rows == 0 or k == 0:
        empty = np.zeros((rows, 0), dtype=np.int64)
        return empty, empty.copy()
    parallel = parallel and rows * blocks[0].shape[1] >= _PARALLEL_MIN
    step = max(1, _SLICE // blocks[0].shape[1])
    if parallel:  # at least one slice per thread
        step = min(step, -(-rows // torch.get_num_threads()))
    slices = [b[i : i + step] for b in blocks for i in range(0, b.shape[0], step)]
    results = _run_slices(slices, k, parallel)
    indices = np.concatenate([r[0] for r in results])
    return indices, np.concatenate([r[1] for r in results])


def _slice_points(part: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    indices = part.abs().topk(k, dim=1).indices
    # Gather on the int16 view: torch's bf16 gather rewrites NaN payloads (to 0xFFFF).
    bits = part.contiguous().view(torch.int16).gather(1, indices).cpu().numpy().astype(np.int64) & 0xFFFF
    return indices.cpu().numpy().astype(np.int64), bits


def _run_slices(slices: list[torch.Tensor], k: int, parallel: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """Top-k of every slice, in order.

    With `parallel`, slices run on torch's thread count of OS threads while torch's intra-op
    threads are set to 1 (as the reference's C++ verify runs a thread per core): measured 1.6x
    faster than one topk call with 2 intra-op threads on a 2-core host, and steadier under load.
    Rows are independent, so the result is identical.  The thread setting is process-wide, so
    callers only ask for this outside of concurrent torch work.
    """
    threads = torch.get_num_threads()
    if not parallel or threads < 2 or len(slices) < 2:
        return [_slice_points(part, k) for part in slices]
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="toploc-topk") as pool:
            return list(pool.map(lambda part: _slice_points(part, k), slices))
    finally:
        torch.set_num_threads(threads)


def prove_points(indices: np.ndarray, bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(moduli [chunks], coefficients [chunks, k]) from each chunk's top-k indices and bits."""
    moduli = injective_moduli(indices)
    return moduli, interpolate(indices % moduli[:, None], bits)


def prove_block(block: torch.Tensor, topk: int) -> tuple[np.ndarray, np.ndarray]:
    """(moduli [chunks], coefficients [chunks, k]) for every row of a bf16 block."""
    return prove_points(*top_points(block, topk))


class BlockStats:
    """Per-chunk comparison figures of a block against its proofs (arrays of length chunks)."""

    def __init__(
        self,
        exp_mismatches: np.ndarray,
        mant_err_mean: np.ndarray,
        median_upper: np.ndarray,
        median_mid: np.ndarray,
        points: int,
    ) -> None:
        self.exp_mismatches = exp_mismatches
        self.mant_err_mean = mant_err_mean
        self.median_upper = median_upper  # sorted[n // 2], as the reference's C++ path
        self.median_mid = median_mid  # statistics.median, as the reference's list path
        self.points = points


def measure_block(
    block: torch.Tensor | Sequence[torch.Tensor],
    moduli: np.ndarray,
    coeffs: np.ndarray,
    topk: int,
    parallel: bool = False,
    signed: bool = False,
) -> BlockStats:
    """Compare the top-k of recomputed activations with the committed polynomials.

    Evaluates each polynomial at (index mod m) - always reduced, unlike the reference's list
    path - and compares bf16 exponents (bits 7..14) and mantissas (bits 0..6); the sign bit is
    not compared, as in the reference, unless `signed` (pipeline stages: a member could otherwise
    forward its activations negated for free), where a sign that differs counts as an exponent
    mismatch.  Rows with modulus 0 (null proofs) match nothing.
    """
    indices, bits = top_points(block, topk, parallel)
    rows, k = indices.shape
    safe_moduli = np.where(moduli > 0, moduli, P)[:, None]
    claimed = evaluate(coeffs, indices % safe_moduli)
    claimed_exp, claimed_mant = (claimed >> 7) & 0xFF, claimed & 0x7F
    actual_exp, actual_mant = (bits >> 7) & 0xFF, bits & 0x7F
    mismatch = (claimed_exp != actual_exp) | (moduli[:, None] <= 0)
    if signed:
        mismatch |= ((claimed >> 15) & 1) != ((bits >> 15) & 1)
    matched = (~mismatch).sum(axis=1)
    errors = np.abs(claimed_mant - actual_mant)
    # Mismatched entries sort to the end, so each row's first `matched` entries are its errors.
    ordered = np.sort(np.where(mismatch, np.iinfo(np.int64).max, errors), axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(mismatch, 0, errors).sum(axis=1) / matched
    row = np.arange(rows)
    upper = ordered[row, np.minimum(matched // 2, max(k - 1, 0))] if k else np.zeros(rows)
    lower = ordered[row, np.maximum((matched - 1) // 2, 0)] if k else np.zeros(rows)
    none = matched == 0
    return BlockStats(
        exp_mismatches=mismatch.sum(axis=1),
        mant_err_mean=np.where(none, NO_MATCH, mean).astype(np.float64),
        median_upper=np.where(none, NO_MATCH, upper).astype(np.float64),
        median_mid=np.where(none, NO_MATCH, (upper + lower) / 2).astype(np.float64),
        points=k,
    )
