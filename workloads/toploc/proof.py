"""The native API: one sample's decode hidden states -> one proof (bytes) -> a verdict.

`build_proof(hidden)` splits hidden[n_positions, hidden_size] into chunks of `chunk_size`
rows and concatenates the chunk proofs; with full-size chunks (chunk_size x hidden_size >= topk)
the bytes equal b"".join(reference.build_proofs_bytes(hidden, chunk_size, topk, skip_prefill=True)).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from pydantic import BaseModel, Field

from workloads.toploc.codec import encode_rows
from workloads.toploc.core import as_bf16, measure_block, prove_points, top_points
from workloads.toploc.settings import ToplocThresholds

CHUNK_SIZE = 32  # decode positions per chunk proof (the reference's decode_batching_size)
TOPK = 128  # points per chunk proof


class ChunkResult(BaseModel):
    index: int = Field(description="chunk number, 0-based")
    positions: tuple[int, int] = Field(description="decode positions [start, end) covered")
    points: int = Field(description="top-k points compared (topk, fewer only for tiny chunks)")
    exp_mismatches: int
    mant_err_mean: float = Field(description="2**64 when no exponent matches, as the reference")
    mant_err_median: float
    passed: bool
    reason: str | None = None


class Verdict(BaseModel):
    passed: bool
    positions: int = Field(description="decode positions verified")
    chunks: list[ChunkResult]
    failing_chunks: list[int] = Field(description="indices of chunks that failed")
    reason: str | None = Field(default=None, description="why the sample failed, for logs and reports")


def _check_hidden(hidden: torch.Tensor) -> torch.Tensor:
    if not isinstance(hidden, torch.Tensor):
        raise TypeError(
            f"hidden must be a torch.Tensor [positions, hidden_size], got {type(hidden).__name__}"
        )
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be 2-D [positions, hidden_size], got shape {tuple(hidden.shape)}")
    if hidden.shape[1] == 0:
        raise ValueError("hidden_size is 0: nothing to commit to")
    return as_bf16(hidden.detach())


def _check_params(chunk_size: int, topk: int) -> None:
    if chunk_size < 1 or topk < 1:
        raise ValueError(f"chunk_size and topk must be >= 1 (got {chunk_size}, {topk})")


def _blocks(hidden: torch.Tensor, chunk_size: int) -> list[tuple[int, torch.Tensor]]:
    """(first chunk index, [chunks, chunk_size*hidden_size] view) for full chunks, then the tail."""
    n = hidden.shape[0]
    full = n // chunk_size
    blocks = []
    if full:
        blocks.append((0, hidden[: full * chunk_size].reshape(full, -1)))
    if n % chunk_size:
        blocks.append((full, hidden[full * chunk_size :].reshape(1, -1)))
    return blocks


def chunk_layout(
    positions: int, hidden_size: int, chunk_size: int = CHUNK_SIZE, topk: int = TOPK
) -> list[int]:
    """Byte length of each chunk proof for a sample of `positions` decode positions."""
    sizes = [chunk_size] * (positions // chunk_size) + (
        [positions % chunk_size] if positions % chunk_size else []
    )
    return [2 + 2 * min(topk, rows * hidden_size) for rows in sizes]


def build_proof(hidden: torch.Tensor, chunk_size: int = CHUNK_SIZE, topk: int = TOPK) -> bytes:
    """Proof of one sample: hidden[n_positions, hidden_size] (final-norm output at decode positions).

    Zero positions give b"" (a one-token completion has no decode positions).  fp32/fp16 input
    is rounded to bf16 first.  A chunk with fewer than topk elements commits to all of them.
    """
    return build_proofs_batch([hidden], chunk_size, topk)[0]


def build_proofs_batch(
    hiddens: Sequence[torch.Tensor],
    chunk_size: int = CHUNK_SIZE,
    topk: int = TOPK,
    *,
    parallel: bool = True,
) -> list[bytes]:
    """`build_proof` for many samples at once: one proof per sample, same bytes as one by one.

    Chunks of every sample are grouped by chunk length (normally two groups: full chunks and
    last partial chunks): the top-k runs over each group in a few large row slices, and the
    modulus search and interpolation run once over all chunks with the same point count.  `parallel` spreads a
    large top-k over OS threads, briefly setting torch's intra-op threads to 1 (process-wide):
    pass False while other threads run torch work that should keep its threads.
    """
    _check_params(chunk_size, topk)
    # width of a chunk (rows x hidden) -> [(sample, first chunk index, block)]
    groups: dict[int, list[tuple[int, int, torch.Tensor]]] = {}
    for sample, hidden in enumerate(hiddens):
        for first, block in _blocks(_check_hidden(hidden), chunk_size):
            groups.setdefault(block.shape[1], []).append((sample, first, block))
    # point count -> [(indices, bits, [(sample, first, rows)])]
    points: dict[int, list[tuple[np.ndarray, np.ndarray, list[tuple[int, int, int]]]]] = {}
    for group in groups.values():
        blocks = [b for _, _, b in group]
        indices, bits = top_points(blocks, topk, parallel)
        places = [(sample, first, b.shape[0]) for sample, first, b in group]
        points.setdefault(indices.shape[1], []).append((indices, bits, places))
    parts: list[dict[int, bytes]] = [{} for _ in hiddens]
    for jobs in points.values():
        moduli, coeffs = prove_points(
            np.concatenate([j[0] for j in jobs]), np.concatenate([j[1] for j in jobs])
        )
        rows = iter(encode_rows(moduli, coeffs))
        for _, _, places in jobs:
            for sample, first, count in places:
                for r in range(count):
                    parts[sample][first + r] = next(rows)
    return [b"".join(p[i] for i in sorted(p)) for p in parts]


def _missing(index: int, span: tuple[int, int]) -> ChunkResult:
    return ChunkResult(
        index=index,
        positions=span,
        points=0,
        exp_mismatches=0,
        mant_err_mean=float(2**64),
        mant_err_median=float(2**64),
        passed=False,
        reason="missing from the proof (truncated)",
    )


def _judge(
    index: int,
    span: tuple[int, int],
    *,
    points: int,
    exp: int,
    mean: float,
    median: float,
    null: bool,
    limits: ToplocThresholds,
    topk: int,
) -> ChunkResult:
    why = []
    if null:
        why.append("null proof (modulus 0)")
    exp_limit = limits.exp_limit(points, topk)
    if exp > exp_limit:
        why.append(f"exponent mismatches {exp} > {exp_limit}")
    if not mean < limits.max_mant_err_mean:
        why.append(f"mantissa error mean {mean:g} >= {limits.max_mant_err_mean:g}")
    if not median < limits.max_mant_err_median:
        why.append(f"mantissa error median {median:g} >= {limits.max_mant_err_median:g}")
    return ChunkResult(
        index=index,
        positions=span,
        points=points,
        exp_mismatches=exp,
        mant_err_mean=mean,
        mant_err_median=median,
        passed=not why,
        reason="; ".join(why) or None,
    )


def verify_proof(
    hidden: torch.Tensor,
    proof: bytes,
    thresholds: ToplocThresholds | None = None,
    chunk_size: int = CHUNK_SIZE,
    topk: int = TOPK,
) -> Verdict:
    """Check a sample's proof against recomputed hidden states [n_positions, hidden_size]."""
    return verify_proofs_batch([hidden], [proof], thresholds, chunk_size, topk)[0]


class _Slot:
    """Where one block of one sample goes: its chunks' rows in the stacked group arrays."""

    __slots__ = ("count", "first", "sample", "start")

    def __init__(self, sample: int, first: int, start: int, count: int) -> None:
        self.sample, self.first, self.start, self.count = sample, first, start, count


def verify_proofs_batch(
    hiddens: Sequence[torch.Tensor],
    proofs: Sequence[bytes],
    thresholds: ToplocThresholds | None = None,
    chunk_size: int = CHUNK_SIZE,
    topk: int = TOPK,
    *,
    parallel: bool = True,
    signed: bool = False,
) -> list[Verdict]:
    """`verify_proof` for many samples at once: one verdict per sample, the same verdicts.

    The chunks of every sample are grouped by chunk length (normally two groups: full chunks and
    last partial chunks); per group the top-k runs in a few large row slices of
    [chunks, chunk_size x hidden], and the proof bytes are decoded and the polynomials evaluated
    in one vectorised step, instead of that work per sample.  Pass/fail is decided on arrays;
    Python runs per chunk only to make the result models.  `parallel` as in `build_proofs_batch`;
    `signed`: a sign that differs is a mismatch too (`core.measure_block`).
    """
    _check_params(chunk_size, topk)
    if len(hiddens) != len(proofs):
        raise ValueError(f"{len(hiddens)} hidden-state tensors but {len(proofs)} proofs")
    thresholds = thresholds or ToplocThresholds()
    checked = [_check_hidden(h) for h in hiddens]
    proofs = [bytes(p) for p in proofs]
    # width of a chunk (rows x hidden) -> blocks to stack, their proof words, where they go
    groups: dict[int, tuple[list[torch.Tensor], list[np.ndarray], list[_Slot]]] = {}
    counts = [0] * len(checked)  # chunks per sample
    length_errors: list[str | None] = []
    for sample, (hidden, proof) in enumerate(zip(checked, proofs, strict=True)):
        n, width = hidden.shape
        layout = chunk_layout(n, width, chunk_size, topk)
        counts[sample] = len(layout)
        offsets = np.concatenate([[0], np.cumsum(layout)]).astype(int)
        length_errors.append(
            None
            if len(proof) == offsets[-1]
            else f"proof is {len(proof)} bytes but {n} positions x hidden {width} need {offsets[-1]} "
            f"({len(layout)} chunk proofs)"
        )
        for first, block in _blocks(hidden, chunk_size):
            rows, size = block.shape[0], layout[first]
            # Chunk proofs of one block have one size, so the present ones are a contiguous run.
            present = min(rows, max(0, (len(proof) - offsets[first]) // size))
            if not present:
                continue
            words = np.frombuffer(proof, dtype=">u2", count=present * size // 2, offset=offsets[first])
            blocks, tables, slots = groups.setdefault(block.shape[1], ([], [], []))
            slots.append(_Slot(sample, first, sum(b.shape[0] for b in blocks), present))
            blocks.append(block[:present])
            tables.append(words.reshape(present, size // 2).astype(np.int64))
    # Per sample, per chunk figures; chunks missing from the proof keep NaN points.
    figures = [np.full((c, 5), np.nan) for c in counts]  # points, exp, mean, median, modulus
    for blocks, tables, slots in groups.values():
        table = np.concatenate(tables)
        stats = measure_block(blocks, table[:, 0], table[:, 1:], topk, parallel, signed)
        columns = np.stack(
            [
                np.full(table.shape[0], stats.points, dtype=np.float64),
                stats.exp_mismatches.astype(np.float64),
                stats.mant_err_mean,
                stats.median_upper,  # sorted[n // 2], as the reference's C++ path
                table[:, 0].astype(np.float64),
            ],
            axis=1,
        )
        for slot in slots:
            figures[slot.sample][slot.first : slot.first + slot.count] = columns[
                slot.start : slot.start + slot.count
            ]
    return [
        _verdict(fig, len(h), length_error, thresholds, chunk_size, topk)
        for fig, h, length_error in zip(figures, checked, length_errors, strict=True)
    ]


def _verdict(
    figures: np.ndarray,
    positions: int,
    length_error: str | None,
    limits: ToplocThresholds,
    chunk_size: int,
    topk: int,
) -> Verdict:
    points, exp, mean, median, modulus = figures.T
    present = ~np.isnan(points)
    full = points >= topk
    partial_limit = (limits.max_exp_mismatches * np.nan_to_num(points)) // topk  # as exp_limit()
    exp_limit = np.where(full, limits.max_exp_mismatches, partial_limit)
    passed = (
        present
        & (modulus > 0)
        & (exp <= exp_limit)
        & (mean < limits.max_mant_err_mean)
        & (median < limits.max_mant_err_median)
    )
    chunks: list[ChunkResult] = []
    for index, ok in enumerate(passed.tolist()):
        span = (index * chunk_size, min((index + 1) * chunk_size, positions))
        if not present[index]:
            chunks.append(_missing(index, span))
        elif ok:  # the common case: no validation or reason building per chunk
            chunks.append(
                ChunkResult.model_construct(
                    index=index,
                    positions=span,
                    points=int(points[index]),
                    exp_mismatches=int(exp[index]),
                    mant_err_mean=float(mean[index]),
                    mant_err_median=float(median[index]),
                    passed=True,
                    reason=None,
                )
            )
        else:
            chunks.append(
                _judge(
                    index,
                    span,
                    points=int(points[index]),
                    exp=int(exp[index]),
                    mean=float(mean[index]),
                    median=float(median[index]),
                    null=bool(modulus[index] == 0),
                    limits=limits,
                    topk=topk,
                )
            )
    reasons = [length_error] if length_error else []
    failing = [c.index for c in chunks if not c.passed]
    if failing:
        reasons.append(
            f"chunk(s) {failing} failed: "
            + " | ".join(f"#{c.index} {c.reason}" for c in chunks if not c.passed)[:2000]
        )
    return Verdict(
        passed=not reasons,
        positions=positions,
        chunks=chunks,
        failing_chunks=failing,
        reason="; ".join(reasons) or None,
    )
