"""The drop-in module keeps the reference's argument meanings and result fields."""

from __future__ import annotations

import base64
import statistics

import numpy as np
import pytest
import torch
from toploc_helpers import activations, relative_noise

import workloads.toploc as tl
from workloads.toploc.field import P, interpolate


def test_prefill_then_decode_steps_chunking() -> None:
    # as the reference's own tests: a [3, 16] prefill, 7 decode steps, batches of 2 -> 1 + 4 proofs
    acts = [activations(3, 16, seed=0)] + [activations(1, 16, seed=i)[0] for i in range(1, 8)]
    proofs = tl.build_proofs_bytes(acts, decode_batching_size=2, topk=5)
    assert len(proofs) == 5 and all(len(p) == 2 + 2 * 5 for p in proofs)
    assert len(tl.build_proofs_bytes(acts[1:], 2, 5, skip_prefill=True)) == 4
    results = tl.verify_proofs_bytes(acts, proofs, 2, 5)
    assert [r.exp_mismatches for r in results] == [0] * 5
    assert results[0].model_dump() == {"exp_mismatches": 0, "mant_err_mean": 0.0, "mant_err_median": 0.0}


def test_list_and_tensor_forms_build_the_same_proofs() -> None:
    hidden = activations(70, 200, seed=1)
    as_tensor = tl.build_proofs_bytes(hidden, 32, 128, skip_prefill=True)
    as_rows = tl.build_proofs_bytes([row for row in hidden], 32, 128, skip_prefill=True)
    as_2d_rows = tl.build_proofs_bytes([row[None] for row in hidden], 32, 128, skip_prefill=True)
    assert as_tensor == as_rows == as_2d_rows and len(as_tensor) == 3
    assert tl.build_proofs_base64(hidden, 32, 128, True) == [base64.b64encode(p).decode() for p in as_tensor]
    assert [p.to_bytes() for p in tl.build_proofs(hidden, 32, 128, True)] == as_tensor


def test_ragged_decode_steps_are_concatenated() -> None:
    acts = [activations(1, n, seed=n)[0] for n in (100, 40, 60, 90, 10)]
    proofs = tl.build_proofs_bytes(acts, 2, 64, skip_prefill=True)
    assert len(proofs) == 3
    assert [r.exp_mismatches for r in tl.verify_proofs_bytes(acts, proofs, 2, 64, skip_prefill=True)] == [
        0,
        0,
        0,
    ]


def test_median_follows_the_reference_path() -> None:
    hidden = activations(64, 128, seed=2)
    proofs = tl.build_proofs_bytes(hidden, 32, 128, skip_prefill=True)
    noisy = relative_noise(hidden, 0.2)
    tensor_path = tl.verify_proofs_bytes(noisy, proofs, 32, 128, skip_prefill=True)
    list_path = tl.verify_proofs_bytes([r for r in noisy], proofs, 32, 128, skip_prefill=True)
    # recompute the statistics by hand for chunk 0
    chunk = noisy[:32].reshape(-1)
    idx = chunk.abs().topk(128).indices
    bits = chunk.view(torch.int16)[idx].numpy().astype(np.int64) & 0xFFFF
    proof = tl.ChunkProof.from_bytes(proofs[0])
    claimed = np.array([proof(int(i)) for i in idx])
    same_exp = ((claimed >> 7) & 0xFF) == ((bits >> 7) & 0xFF)
    errs = sorted(np.abs((claimed & 0x7F) - (bits & 0x7F))[same_exp].tolist())
    assert tensor_path[0].exp_mismatches == list_path[0].exp_mismatches == int((~same_exp).sum())
    assert tensor_path[0].mant_err_mean == pytest.approx(statistics.mean(errs))
    assert tensor_path[0].mant_err_median == errs[len(errs) // 2]  # the C++ path's upper median
    assert list_path[0].mant_err_median == statistics.median(errs)  # the Python path's median


def test_indices_are_reduced_mod_m_on_every_path() -> None:
    # 32 x 4096 > 65497: the modulus matters; the reference's list path forgot it.
    hidden = activations(32, 4096, seed=3)
    proofs = tl.build_proofs_bytes(hidden, 32, 128, skip_prefill=True)
    for acts in (hidden, [r for r in hidden]):
        assert tl.verify_proofs_bytes(acts, proofs, 32, 128, skip_prefill=True)[0].exp_mismatches == 0


def test_modulus_below_p_when_indices_collide() -> None:
    hidden = torch.zeros(32, 2100, dtype=torch.bfloat16)
    flat = hidden.view(-1)
    flat[torch.arange(128) * 17] = 1.0
    flat[100], flat[100 + P] = 50.0, -60.0  # equal mod p
    proof = tl.ChunkProof.from_bytes(tl.build_proofs_bytes(hidden, 32, 128, skip_prefill=True)[0])
    assert proof.modulus < P
    assert proof(100) == 0x4248 and proof(100 + P) == 0xC270  # bf16 bits of 50 and -60


def test_no_match_gives_the_reference_sentinel() -> None:
    hidden = activations(32, 64, seed=4)
    proofs = tl.build_proofs_bytes(hidden, 32, 128, skip_prefill=True)
    result = tl.verify_proofs_bytes(hidden * 1e6, proofs, 32, 128, skip_prefill=True)[0]
    assert result.exp_mismatches == 128 and result.mant_err_mean == result.mant_err_median == 2.0**64


def test_proof_count_mismatch() -> None:
    hidden = activations(64, 64, seed=5)
    proofs = tl.build_proofs_bytes(hidden, 32, 128, skip_prefill=True)
    with pytest.raises(ValueError, match="3 proofs but the activations make only 2 chunks"):
        tl.verify_proofs_bytes(hidden, proofs + proofs[:1], 32, 128, skip_prefill=True)
    # the list path zips, as the reference does
    assert len(tl.verify_proofs_bytes([r for r in hidden], proofs[:1], 32, 128, skip_prefill=True)) == 1
    with pytest.raises(tl.ProofFormatError, match="chunk proof 0 is 3 bytes"):
        tl.verify_proofs_bytes(hidden, [b"\x00\x01\x02"], 32, 128, skip_prefill=True)


def test_chunk_proof_round_trip() -> None:
    coeffs = interpolate(np.array([[1, 2, 3]]), np.array([[10, 20, 65535]]))[0].tolist()
    proof = tl.ChunkProof(modulus=P, coeffs=coeffs)
    assert tl.ChunkProof.from_bytes(proof.to_bytes()) == proof and len(proof.to_bytes()) == 8
    assert [proof(1), proof(2), proof(3)] == [10, 20, 65535 % P]
    with pytest.raises(ValueError, match="null proof"):
        tl.ChunkProof.null(4)(1)


def test_empty_decode() -> None:
    empty = torch.zeros(0, 896, dtype=torch.bfloat16)
    assert tl.build_proofs_bytes(empty, 32, 128, skip_prefill=True) == []
    assert tl.verify_proofs_bytes(empty, [], 32, 128, skip_prefill=True) == []
    with pytest.raises(ValueError, match="skip_prefill=False expects the prefill"):
        tl.build_proofs_bytes([], 32, 128)
