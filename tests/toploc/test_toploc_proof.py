"""The native API: honest activations pass, tampered ones fail, edges behave as documented."""

from __future__ import annotations

import pytest
import torch
from toploc_helpers import activations, final_hidden, relative_noise, tiny_transformer

from workloads.toploc import (
    ChunkProof,
    ToplocThresholds,
    build_proof,
    build_proofs_batch,
    build_proofs_bytes,
    chunk_layout,
    verify_proof,
)


@pytest.fixture(scope="module")
def sample() -> tuple[torch.Tensor, bytes]:
    hidden = activations(100, 896, seed=11, scale=2.0)  # 3 full chunks + a partial chunk of 4
    return hidden, build_proof(hidden)


def test_size_is_258_bytes_per_chunk_and_matches_the_dropin(sample) -> None:
    hidden, proof = sample
    assert len(proof) == 4 * 258 == sum(chunk_layout(100, 896))
    assert proof == b"".join(build_proofs_bytes(hidden, 32, 128, skip_prefill=True))
    assert build_proof(hidden.clone()) == proof  # deterministic


def test_honest_activations_pass_with_zero_error(sample) -> None:
    hidden, proof = sample
    verdict = verify_proof(hidden, proof)
    assert verdict.passed and verdict.reason is None and verdict.failing_chunks == []
    assert [c.positions for c in verdict.chunks] == [(0, 32), (32, 64), (64, 96), (96, 100)]
    assert all(c.exp_mismatches == 0 and c.mant_err_mean == 0 and c.points == 128 for c in verdict.chunks)


def test_small_numeric_noise_is_tolerated(sample) -> None:
    # ~1 bf16 ulp of relative noise: what another GPU, kernel or batch size produces.
    hidden, proof = sample
    verdict = verify_proof(relative_noise(hidden, 0.005), proof)
    assert verdict.passed, verdict.reason
    assert max(c.mant_err_mean for c in verdict.chunks) > 0  # the noise did change bits


def test_large_perturbation_fails_and_names_the_chunks(sample) -> None:
    hidden, proof = sample
    verdict = verify_proof(relative_noise(hidden, 0.3), proof)
    assert not verdict.passed
    assert verdict.failing_chunks == [0, 1, 2, 3]
    assert "chunk(s) [0, 1, 2, 3] failed" in verdict.reason


def test_one_tampered_chunk_is_the_only_failing_chunk(sample) -> None:
    hidden, proof = sample
    forged = hidden.clone()
    forged[32:64] = activations(32, 896, seed=99, scale=2.0)
    verdict = verify_proof(forged, proof)
    assert verdict.failing_chunks == [1]
    assert not verdict.passed and verdict.chunks[1].exp_mismatches > 38


def test_different_model_fails_and_same_model_passes() -> None:
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    honest = final_hidden(tiny_transformer(1), x, torch.bfloat16)
    proof = build_proof(honest)
    assert verify_proof(final_hidden(tiny_transformer(1), x, torch.bfloat16), proof).passed
    other = verify_proof(final_hidden(tiny_transformer(2), x, torch.bfloat16), proof)
    assert not other.passed and other.failing_chunks == [0, 1]


def test_fp32_model_vs_bf16_model() -> None:
    """fp32 and bf16 runs of the same small model differ by about one bf16 ulp: the default
    thresholds (made to absorb GPU non-determinism) accept that, strict thresholds catch it.
    Whether a real model's fp32 run exceeds the defaults is a model-level property."""
    weights = tiny_transformer(3)
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(4))
    proof = build_proof(final_hidden(weights, x, torch.bfloat16))
    fp32 = final_hidden(weights, x, torch.float32)
    assert fp32.dtype == torch.float32  # rounded to bf16 inside verify_proof
    strict = ToplocThresholds(max_exp_mismatches=0, max_mant_err_mean=0.25, max_mant_err_median=0.5)
    assert verify_proof(final_hidden(weights, x, torch.bfloat16), proof, strict).passed
    loose = verify_proof(fp32, proof)
    caught = verify_proof(fp32, proof, strict)
    assert loose.passed
    assert not caught.passed and caught.failing_chunks
    assert all(0 < c.mant_err_mean < 10 for c in loose.chunks)


def test_permuted_rows_fail(sample) -> None:
    hidden, proof = sample
    within = hidden.clone()
    within[0:32] = hidden[0:32].flip(0)  # same values, other positions, inside one chunk
    swapped = torch.cat([hidden[32:64], hidden[0:32], hidden[64:]])  # two whole chunks swapped
    assert verify_proof(within, proof).failing_chunks == [0]
    assert verify_proof(swapped, proof).failing_chunks == [0, 1]


def test_truncated_proof_fails_naming_missing_chunks(sample) -> None:
    hidden, proof = sample
    verdict = verify_proof(hidden, proof[: 2 * 258 + 100])
    assert not verdict.passed and verdict.failing_chunks == [2, 3]
    assert "missing" in verdict.chunks[2].reason and verdict.chunks[0].passed
    assert "proof is 616 bytes" in verdict.reason


def test_truncated_output_fails(sample) -> None:
    hidden, proof = sample
    verdict = verify_proof(hidden[:90], proof)  # the worker claims fewer tokens than it proved
    assert not verdict.passed and "need" in verdict.reason
    assert not verify_proof(hidden, b"").passed
    assert not verify_proof(hidden, proof + b"\x00\x01").passed  # trailing bytes


def test_null_proof_fails_cleanly(sample) -> None:
    hidden, proof = sample
    nulls = ChunkProof.null(128).to_bytes() * 4
    verdict = verify_proof(hidden, nulls)
    assert verdict.failing_chunks == [0, 1, 2, 3] and "null proof" in verdict.chunks[0].reason


def test_zero_positions_give_an_empty_proof_that_verifies() -> None:
    empty = torch.zeros(0, 896, dtype=torch.bfloat16)
    assert build_proof(empty) == b""
    verdict = verify_proof(empty, b"")
    assert verdict.passed and verdict.chunks == [] and verdict.positions == 0
    assert not verify_proof(empty, b"\x00" * 258).passed


def test_partial_final_chunk_of_one_position() -> None:
    hidden = activations(33, 256, seed=5)
    proof = build_proof(hidden)
    assert len(proof) == 2 * 258  # 256 elements in the last chunk still give 128 points
    assert verify_proof(hidden, proof).passed
    forged = hidden.clone()
    forged[32] = -forged[32].flip(0)
    assert verify_proof(forged, proof).failing_chunks == [1]


def test_tiny_hidden_commits_to_every_element() -> None:
    # 32 x 3 = 96 < 128 elements: the chunk commits to all of them (96 coefficients);
    # the last chunk (2 rows x 3) commits to its 6 elements.
    hidden = activations(34, 3, seed=6)
    proof = build_proof(hidden)
    assert chunk_layout(34, 3) == [2 + 2 * 96, 2 + 2 * 6]
    assert len(proof) == 194 + 14
    verdict = verify_proof(hidden, proof)
    assert verdict.passed and [c.points for c in verdict.chunks] == [96, 6]
    assert not verify_proof(relative_noise(hidden, 0.5), proof).passed


def test_non_finite_values_are_deterministic() -> None:
    hidden = activations(64, 128, seed=7)
    hidden[3, 5], hidden[7, 9], hidden[8, 1], hidden[40] = (
        float("nan"),
        float("inf"),
        -float("inf"),
        float("nan"),
    )
    proof = build_proof(hidden)
    assert proof == build_proof(hidden.clone())
    assert verify_proof(hidden, proof).passed
    # NaN outranks everything in torch.topk, so the NaN row fills chunk 1's top-k; a clean
    # row in its place is caught.
    clean = hidden.clone()
    clean[40] = activations(1, 128, seed=8)[0]
    assert verify_proof(clean, proof).failing_chunks == [1]


def test_fp32_input_is_rounded_to_bf16() -> None:
    x = torch.randn(40, 200, generator=torch.Generator().manual_seed(9))
    assert build_proof(x) == build_proof(x.to(torch.bfloat16))
    assert verify_proof(x, build_proof(x.to(torch.bfloat16))).passed


def test_thresholds_come_from_settings(monkeypatch: pytest.MonkeyPatch, sample) -> None:
    hidden, proof = sample
    monkeypatch.setenv("INTELLECT_TOPLOC_MAX_MANT_ERR_MEAN", "0.001")
    strict = ToplocThresholds()
    assert strict.max_mant_err_mean == 0.001 and strict.max_exp_mismatches == 38
    noisy = relative_noise(hidden, 0.005)
    assert not verify_proof(noisy, proof, strict).passed
    assert not verify_proof(noisy, proof).passed  # no thresholds given: read from the environment
    assert verify_proof(noisy, proof, ToplocThresholds(max_mant_err_mean=10)).passed  # arguments win


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (torch.zeros(4, 8, 2), "2-D"),
        (torch.zeros(4), "2-D"),
        (torch.zeros(4, 0), "hidden_size is 0"),
        (torch.zeros(4, 8, dtype=torch.int64), "floating-point"),
    ],
)
def test_bad_input_is_named(bad: torch.Tensor, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        build_proof(bad)
    with pytest.raises((ValueError, TypeError), match=message):
        verify_proof(bad, b"")
    with pytest.raises(TypeError, match="torch.Tensor"):
        build_proof([[1.0]])  # type: ignore[arg-type]


def test_batch_build_equals_one_by_one() -> None:
    # mixed sizes, including a sample whose only chunk is partial and tiny hidden sizes, so
    # chunks of different point counts interleave across samples
    samples = [
        activations(2, 3, seed=20),
        activations(34, 3, seed=21),
        activations(0, 896, seed=22),
        activations(100, 896, seed=23),
        activations(7, 896, seed=24),
    ]
    assert build_proofs_batch(samples) == [build_proof(h) for h in samples]
    assert build_proofs_batch([]) == []
