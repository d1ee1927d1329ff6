"""Interop with the reference toploc library, when it is installed (built from source).

Install it with `make toploc-ref` (see docs/toploc.md); without it these tests skip loudly.
"""

from __future__ import annotations

import pytest
import torch
from toploc_helpers import activations, relative_noise

import workloads.toploc as ours

try:
    import toploc as reference

    reference.build_proofs_bytes  # noqa: B018 - a namespace package of the same name is not it
    REASON = ""
except Exception as exc:  # ImportError, or the PyPI wheel's undefined-symbol error with torch 2.13
    reference = None
    REASON = f"REFERENCE toploc NOT IMPORTABLE ({type(exc).__name__}: {exc}); run `make toploc-ref`"

pytestmark = pytest.mark.skipif(reference is None, reason=REASON)


def rows_form(hidden: torch.Tensor) -> list[torch.Tensor]:
    return [row for row in hidden]


CASES = [
    ("qwen-0.5b-like", 130, 896, 1.0),
    ("wide", 70, 4096, 3.0),  # chunks wider than the field prime
    ("edge-2047", 64, 2047, 1.0),
    ("ties", 96, 64, None),
]


def make(rows: int, hidden: int, scale: float | None, seed: int) -> torch.Tensor:
    if scale is None:  # integer-valued: many ties at the top-k boundary
        g = torch.Generator().manual_seed(seed)
        return torch.randint(-6, 7, (rows, hidden), generator=g).to(torch.bfloat16)
    return activations(rows, hidden, seed=seed, scale=scale)


@pytest.mark.parametrize(("label", "rows", "hidden", "scale"), CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_bytes_identical_and_cross_verify(label: str, rows: int, hidden: int, scale, seed: int) -> None:
    h = make(rows, hidden, scale, seed)
    theirs = reference.build_proofs_bytes(h, 32, 128, skip_prefill=True)
    mine = ours.build_proofs_bytes(h, 32, 128, skip_prefill=True)
    assert mine == theirs
    assert ours.build_proof(h) == b"".join(theirs)
    noisy = relative_noise(h, 0.05, seed=seed + 10)
    for acts in (h, noisy):
        a = reference.verify_proofs_bytes(acts, mine, 32, 128, skip_prefill=True)
        b = ours.verify_proofs_bytes(acts, theirs, 32, 128, skip_prefill=True)
        assert [(r.exp_mismatches, r.mant_err_mean, r.mant_err_median) for r in a] == [
            (r.exp_mismatches, r.mant_err_mean, r.mant_err_median) for r in b
        ]
    assert all(
        r.exp_mismatches == 0 for r in reference.verify_proofs_bytes(h, mine, 32, 128, skip_prefill=True)
    )


def test_list_form_with_prefill_and_non_finite() -> None:
    h = activations(50, 300, seed=4)
    h[3, 3], h[20] = float("inf"), float("nan")
    acts = [activations(6, 300, seed=5)] + rows_form(h)
    theirs = reference.build_proofs_bytes(acts, 16, 64, skip_prefill=False)
    assert ours.build_proofs_bytes(acts, 16, 64, skip_prefill=False) == theirs
    noisy = [acts[0]] + rows_form(relative_noise(h, 0.2))
    # hidden 300 x 16 < 65497, so the reference's list path (no mod m) is still correct here
    a = reference.verify_proofs_bytes(noisy, theirs, 16, 64)
    b = ours.verify_proofs_bytes(noisy, theirs, 16, 64)
    assert [(r.exp_mismatches, r.mant_err_mean, r.mant_err_median) for r in a] == [
        (r.exp_mismatches, r.mant_err_mean, r.mant_err_median) for r in b
    ]


def test_reference_verdicts_follow_ours_through_the_thresholds() -> None:
    h = activations(64, 896, seed=6, scale=2.0)
    proof = ours.build_proof(h)
    chunks = [proof[i : i + 258] for i in range(0, len(proof), 258)]
    t = ours.ToplocThresholds()
    for acts in (h, relative_noise(h, 0.005), relative_noise(h, 0.3)):
        theirs = reference.verify_proofs_bytes(acts, chunks, 32, 128, skip_prefill=True)
        passed = all(
            r.exp_mismatches <= t.max_exp_mismatches
            and r.mant_err_mean < t.max_mant_err_mean
            and r.mant_err_median < t.max_mant_err_median
            for r in theirs
        )
        assert ours.verify_proof(acts, proof).passed == passed
