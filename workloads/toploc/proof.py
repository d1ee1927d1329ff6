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

from workloads.toploc.codec import decode_rows, encode_rows
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
    hiddens: Sequence[torch.Tensor], chunk_size: int = CHUNK_SIZE, topk: int = TOPK
) -> list[bytes]:
    """`build_proof` for many samples at once: one proof per sample, same bytes as one by one.

    Top-k runs per block; the modulus search and interpolation run once over the chunks of
    every sample (grouped by point count), which is what makes batches cheap.
    """
    _check_params(chunk_size, topk)
    # points -> [(sample, first chunk index, indices, bits)]
    jobs: dict[int, list[tuple[int, int, np.ndarray, np.ndarray]]] = {}
    for sample, hidden in enumerate(hiddens):
        for first, block in _blocks(_check_hidden(hidden), chunk_size):
            indices, bits = top_points(block, topk)
            jobs.setdefault(indices.shape[1], []).append((sample, first, indices, bits))
    parts: list[dict[int, bytes]] = [{} for _ in hiddens]
    for group in jobs.values():
        moduli, coeffs = prove_points(
            np.concatenate([j[2] for j in group]), np.concatenate([j[3] for j in group])
        )
        rows = iter(encode_rows(moduli, coeffs))
        for sample, first, indices, _ in group:
            for r in range(indices.shape[0]):
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
    _check_params(chunk_size, topk)
    thresholds = thresholds or ToplocThresholds()
    hidden = _check_hidden(hidden)
    n, width = hidden.shape
    layout = chunk_layout(n, width, chunk_size, topk)
    offsets = np.concatenate([[0], np.cumsum(layout)]).astype(int)
    proof = bytes(proof)
    reasons: list[str] = []
    if len(proof) != offsets[-1]:
        reasons.append(
            f"proof is {len(proof)} bytes but {n} positions x hidden {width} need {offsets[-1]} "
            f"({len(layout)} chunk proofs)"
        )
    chunks: list[ChunkResult] = []
    for first, block in _blocks(hidden, chunk_size):
        rows = block.shape[0]
        spans = [(offsets[first + r], offsets[first + r + 1]) for r in range(rows)]
        present = [end <= len(proof) for _, end in spans]
        pieces = [proof[s:e] for (s, e), ok in zip(spans, present, strict=True) if ok]
        stats = None
        if pieces:
            moduli, coeffs = decode_rows(pieces)
            stats = measure_block(block[: len(pieces)], moduli, coeffs, topk)
        for r in range(rows):
            index = first + r
            span = (index * chunk_size, min((index + 1) * chunk_size, n))
            if not present[r]:
                chunks.append(_missing(index, span))
                continue
            chunks.append(
                _judge(
                    index,
                    span,
                    points=stats.points,
                    exp=int(stats.exp_mismatches[r]),
                    mean=float(stats.mant_err_mean[r]),
                    median=float(stats.median_upper[r]),  # sorted[n // 2], as the reference's C++ path
                    null=bool(moduli[r] == 0),
                    limits=thresholds,
                    topk=topk,
                )
            )
    failing = [c.index for c in chunks if not c.passed]
    if failing:
        reasons.append(
            f"chunk(s) {failing} failed: "
            + " | ".join(f"#{c.index} {c.reason}" for c in chunks if not c.passed)[:2000]
        )
    return Verdict(
        passed=not reasons,
        positions=n,
        chunks=chunks,
        failing_chunks=failing,
        reason="; ".join(reasons) or None,
    )
