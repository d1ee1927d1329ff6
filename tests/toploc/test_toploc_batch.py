"""Batched verification and streamed building give exactly what one-by-one calls give."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from toploc_helpers import activations, relative_noise

from workloads.toploc import (
    ToplocThresholds,
    build_proof,
    build_proofs_batch,
    verify_proof,
    verify_proofs_batch,
)
from workloads.toploc.field import P, evaluate
from workloads.toploc.stream import ProofStream


def horner(coeffs: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Plain integer Horner: the obvious definition the blocked float evaluation must equal."""
    x = x % P
    result = np.zeros(x.shape, dtype=np.int64)
    for j in range(coeffs.shape[1] - 1, -1, -1):
        result = (result * x + coeffs[:, j : j + 1]) % P
    return result


@pytest.mark.parametrize("rows,degree,points", [(1, 1, 1), (3, 5, 7), (70, 128, 128), (5, 130, 3), (2, 0, 4)])
def test_blocked_evaluation_equals_horner(rows: int, degree: int, points: int) -> None:
    rng = np.random.default_rng(rows * 1000 + degree)
    coeffs = rng.integers(0, 65536, (rows, degree))  # any u16, also >= p, as a forged proof may hold
    x = rng.integers(0, 2**31, (rows, points))
    x[0, : min(points, 3)] = [0, P, P - 1][: min(points, 3)]
    assert (evaluate(coeffs, x) == horner(coeffs, x)).all()
    worst, top = np.full((rows, max(degree, 1)), 65535), np.full((rows, points), P - 1)
    assert (evaluate(worst, top) == horner(worst, top)).all()


def _mixed_batch() -> tuple[list[torch.Tensor], list[bytes]]:
    """Samples of different lengths (full chunks, partial last chunks, none) and hidden sizes."""
    shapes = [(100, 64), (32, 64), (1, 64), (0, 64), (70, 64), (40, 3), (65, 200)]
    hiddens = [activations(n, h, seed=i) for i, (n, h) in enumerate(shapes)]
    return hiddens, build_proofs_batch(hiddens)


def test_batch_verify_equals_one_by_one_on_honest_and_forged_samples() -> None:
    hiddens, proofs = _mixed_batch()
    recomputed = list(hiddens)
    recomputed[0] = relative_noise(hiddens[0], 0.3)  # fails
    recomputed[4] = relative_noise(hiddens[4], 0.002, seed=5)  # passes
    proofs = list(proofs)
    proofs[1] = proofs[1][:-2]  # truncated: named
    proofs[6] = proofs[6] + b"\x00\x01"  # trailing bytes
    forged = bytearray(proofs[2])
    forged[0:2] = b"\x00\x00"  # null modulus
    proofs[2] = bytes(forged)
    tight = ToplocThresholds(max_exp_mismatches=3, max_mant_err_mean=2, max_mant_err_median=2)
    for limits in (None, tight):
        batch = verify_proofs_batch(recomputed, proofs, limits)
        single = [verify_proof(h, p, limits) for h, p in zip(recomputed, proofs, strict=True)]
        assert [v.model_dump() for v in batch] == [v.model_dump() for v in single]
    verdicts = verify_proofs_batch(recomputed, proofs)
    assert [v.passed for v in verdicts] == [False, False, False, True, True, True, False]
    assert verdicts[0].failing_chunks == [0, 1, 2, 3]
    assert "missing from the proof" in verdicts[1].chunks[0].reason
    assert "null proof" in verdicts[2].reason
    assert "bytes but" in verdicts[6].reason and verdicts[6].failing_chunks == []


def test_batch_verify_reports_the_same_figures_as_one_sample_calls() -> None:
    hiddens = [activations(96, 896, seed=s) for s in range(4)]
    proofs = build_proofs_batch(hiddens)
    noisy = [relative_noise(h, 0.01, seed=9) for h in hiddens]
    batch = verify_proofs_batch(noisy, proofs)
    for verdict, h, p in zip(batch, noisy, proofs, strict=True):
        single = verify_proof(h, p)
        assert verdict == single
        assert any(c.mant_err_mean > 0 for c in verdict.chunks)  # a real comparison, not zeros


def test_batch_verify_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="2 hidden-state tensors but 1 proofs"):
        verify_proofs_batch([activations(4, 8), activations(4, 8)], [b""])


@pytest.mark.parametrize("background", [True, False])
def test_streamed_chunks_give_the_batch_bytes(background: bool) -> None:
    lengths = [100, 31, 64, 65, 0]
    hiddens = [activations(n, 48, seed=n) for n in lengths]
    stream = ProofStream(background=background)
    for chunk in range(3):  # the decoder hands over chunk j of every sequence still that long
        rows = [i for i, n in enumerate(lengths) if n >= 32 * (chunk + 1)]
        if chunk == 2:
            rows = rows[:1]  # a sequence may also be left for finish() to prove
        block = torch.stack([hiddens[i][32 * chunk : 32 * (chunk + 1)] for i in rows]) if rows else None
        if block is not None:
            stream.add_chunk(chunk, rows, block)
    assert stream.finish(hiddens) == build_proofs_batch(hiddens) == [build_proof(h) for h in hiddens]


def test_stream_rejects_gaps_and_bad_blocks() -> None:
    stream = ProofStream(background=False)
    with pytest.raises(ValueError, match="block must be"):
        stream.add_chunk(0, [0], activations(31, 8).unsqueeze(0))
    stream.add_chunk(1, [0], activations(32, 8).unsqueeze(0))
    with pytest.raises(ValueError, match="not 0..0"):
        stream.finish([activations(64, 8)])
