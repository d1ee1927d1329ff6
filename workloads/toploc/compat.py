"""Drop-in for code written against the reference `toploc` 0.1.x module.

Argument meanings follow the reference:
- `activations`: either a list of tensors - activations[0] is the prefill (any shape, proved
  as one flattened chunk unless `skip_prefill`), then one tensor per decode step - or one tensor
  whose first dimension is the decode step (a 2-D [positions, hidden] tensor with
  skip_prefill=True is what prime-rl passes).
- `decode_batching_size` decode steps are flattened and concatenated into one chunk.
- `skip_prefill=True` means the prefill is NOT in `activations`.
- build returns one proof (bytes / base64 str) per chunk; verify returns one
  `VerificationResult` per proof with `exp_mismatches`, `mant_err_mean`, `mant_err_median`.

Deliberate differences, all on inputs the reference cannot handle:
- indices are always reduced mod m before evaluation (the reference's list path forgets);
- fp32/fp16 activations are rounded to bf16 (the reference returns null proofs for fp32);
- a chunk with fewer than `topk` elements commits to all of them (the reference returns null
  proofs for the whole sample, and its verify raises);
- a null proof (modulus 0) verifies as "all mismatched" (the reference divides by zero).
The median follows the path the reference would take: sorted[n // 2] for a tensor with
skip_prefill=True (its C++ path), statistics.median otherwise (its Python path).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import numpy as np
import structlog
import torch
from pydantic import BaseModel

from workloads.toploc.codec import ChunkProof, decode_rows, encode_rows
from workloads.toploc.core import as_bf16, measure_block, prove_block
from workloads.toploc.field import ModulusNotFoundError

log = structlog.get_logger(__name__)

ProofPoly = ChunkProof
Activations = Sequence[torch.Tensor] | torch.Tensor


class VerificationResult(BaseModel):
    exp_mismatches: int
    mant_err_mean: float
    mant_err_median: float


def _blocks(
    activations: Activations, decode_batching_size: int, skip_prefill: bool
) -> tuple[int, list[tuple[list[int], torch.Tensor]]]:
    """(number of chunks, [(chunk numbers, bf16 block [chunks, length])]) in the reference's
    batching; equal-size decode steps become views of one block, not copies per chunk."""
    if decode_batching_size < 1:
        raise ValueError(f"decode_batching_size must be >= 1, got {decode_batching_size}")
    blocks: list[tuple[list[int], torch.Tensor]] = []
    count = 0

    def add(block: torch.Tensor) -> None:
        nonlocal count
        blocks.append((list(range(count, count + block.shape[0])), block))
        count += block.shape[0]

    start = 0
    if not skip_prefill:
        if len(activations) == 0:
            raise ValueError("activations is empty but skip_prefill=False expects the prefill first")
        add(as_bf16(activations[0]).reshape(1, -1))
        start = 1
    decode = activations[start:]
    if len(decode) == 0:
        return count, blocks
    if isinstance(decode, torch.Tensor) or (decode and len({t.numel() for t in decode}) == 1):
        steps = (
            as_bf16(decode).reshape(decode.shape[0], -1)
            if isinstance(decode, torch.Tensor)
            else torch.stack([as_bf16(t).reshape(-1) for t in decode])
        )
        full = steps.shape[0] // decode_batching_size
        if full:
            add(steps[: full * decode_batching_size].reshape(full, -1))
        if steps.shape[0] % decode_batching_size:
            add(steps[full * decode_batching_size :].reshape(1, -1))
    else:  # ragged steps: one block per chunk
        for i in range(0, len(decode), decode_batching_size):
            add(torch.cat([as_bf16(t).reshape(-1) for t in decode[i : i + decode_batching_size]])[None])
    return count, blocks


def _build(activations: Activations, decode_batching_size: int, topk: int, skip_prefill: bool) -> list[bytes]:
    count, blocks = _blocks(activations, decode_batching_size, skip_prefill)
    out: list[bytes] = [b""] * count
    try:
        for numbers, block in blocks:
            moduli, coeffs = prove_block(block, topk)
            for i, proof in zip(numbers, encode_rows(moduli, coeffs), strict=True):
                out[i] = proof
    except ModulusNotFoundError as exc:  # the reference's "do not crash" fallback
        log.error("error building proofs; null proofs returned", error=str(exc))
        return [ChunkProof.null(topk).to_bytes()] * count
    return out


def build_proofs_bytes(
    activations: Activations, decode_batching_size: int, topk: int, skip_prefill: bool = False
) -> list[bytes]:
    return _build(activations, decode_batching_size, topk, skip_prefill)


def build_proofs_base64(
    activations: Activations, decode_batching_size: int, topk: int, skip_prefill: bool = False
) -> list[str]:
    return [
        base64.b64encode(p).decode() for p in _build(activations, decode_batching_size, topk, skip_prefill)
    ]


def build_proofs(
    activations: Activations, decode_batching_size: int, topk: int, skip_prefill: bool = False
) -> list[ChunkProof]:
    return [ChunkProof.from_bytes(p) for p in _build(activations, decode_batching_size, topk, skip_prefill)]


def _verify(
    activations: Activations, proofs: list[bytes], decode_batching_size: int, topk: int, skip_prefill: bool
) -> list[VerificationResult]:
    tensor_path = isinstance(activations, torch.Tensor) and skip_prefill
    total, blocks = _blocks(activations, decode_batching_size, skip_prefill)
    if tensor_path and len(proofs) > total:
        raise ValueError(f"{len(proofs)} proofs but the activations make only {total} chunks")
    count = min(len(proofs), total)  # the reference zips proofs with chunks
    moduli, coeffs = decode_rows(list(proofs[:count]))
    results: list[VerificationResult | None] = [None] * count
    for numbers, block in blocks:
        numbers = [i for i in numbers if i < count]
        if not numbers:
            continue
        rows = np.array(numbers)
        stats = measure_block(block[: len(numbers)], moduli[rows], coeffs[rows], topk)
        medians = stats.median_upper if tensor_path else stats.median_mid
        for r, i in enumerate(numbers):
            results[i] = VerificationResult(
                exp_mismatches=int(stats.exp_mismatches[r]),
                mant_err_mean=float(stats.mant_err_mean[r]),
                mant_err_median=float(medians[r]),
            )
    return results  # type: ignore[return-value]


def verify_proofs_bytes(
    activations: Activations,
    proofs: list[bytes],
    decode_batching_size: int,
    topk: int,
    skip_prefill: bool = False,
) -> list[VerificationResult]:
    return _verify(activations, [bytes(p) for p in proofs], decode_batching_size, topk, skip_prefill)


def verify_proofs_base64(
    activations: Activations,
    proofs: list[str],
    decode_batching_size: int,
    topk: int,
    skip_prefill: bool = False,
) -> list[VerificationResult]:
    return _verify(
        activations, [base64.b64decode(p) for p in proofs], decode_batching_size, topk, skip_prefill
    )


def verify_proofs(
    activations: Activations,
    proofs: list[ChunkProof],
    decode_batching_size: int,
    topk: int,
    skip_prefill: bool = False,
) -> list[VerificationResult]:
    return _verify(activations, [p.to_bytes() for p in proofs], decode_batching_size, topk, skip_prefill)
