"""Known-answer vectors made by the reference toploc 0.1.6 (tests/toploc/vectors/make_vectors.py).

Runs everywhere: no reference library needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

import workloads.toploc as tl

VECTORS = Path(__file__).resolve().parent / "vectors"
EXPECTED = json.loads((VECTORS / "expected.json").read_text())
TENSORS = load_file(str(VECTORS / "activations.safetensors"))


def activations(name: str, variant: str, case: dict):
    if case["form"] == "list":
        decode = TENSORS[f"{name}.{variant}.decode"]
        return [TENSORS[f"{name}.{variant}.prefill"]] + [row for row in decode]
    return TENSORS[f"{name}.{variant}"]


@pytest.mark.parametrize("name", sorted(EXPECTED["cases"]))
def test_proof_bytes_equal_the_reference(name: str) -> None:
    case = EXPECTED["cases"][name]
    proofs = tl.build_proofs_bytes(
        activations(name, "identical", case),
        case["decode_batching_size"],
        case["topk"],
        skip_prefill=case["skip_prefill"],
    )
    assert [p.hex() for p in proofs] == case["proofs"]


@pytest.mark.parametrize("variant", ["identical", "perturbed", "unrelated"])
@pytest.mark.parametrize("name", sorted(EXPECTED["cases"]))
def test_verification_equals_the_reference(name: str, variant: str) -> None:
    case = EXPECTED["cases"][name]
    proofs = [bytes.fromhex(p) for p in case["proofs"]]
    results = tl.verify_proofs_bytes(
        activations(name, variant, case),
        proofs,
        case["decode_batching_size"],
        case["topk"],
        skip_prefill=case["skip_prefill"],
    )
    got = [[r.exp_mismatches, r.mant_err_mean, r.mant_err_median] for r in results]
    want = case["verify"][variant]
    assert [g[0] for g in got] == [w[0] for w in want]  # exponent mismatches: exact
    assert [g[1:] for g in got] == [pytest.approx(w[1:], rel=1e-12) for w in want]


def test_native_api_agrees_on_the_decode_vectors() -> None:
    case = EXPECTED["cases"]["decode_896"]
    hidden = TENSORS["decode_896.identical"]
    assert tl.build_proof(hidden).hex() == "".join(case["proofs"])
    assert tl.verify_proof(hidden, tl.build_proof(hidden)).passed
    assert not tl.verify_proof(TENSORS["decode_896.unrelated"], bytes.fromhex("".join(case["proofs"]))).passed
