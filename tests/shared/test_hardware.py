"""The hardware challenge's math (intellect/hardware.py): honest products pass in every precision and at
every size the challenger may pick (short ones included), and each way of answering without having
computed the product is caught, with the reason a pool owner reads."""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from intellect import hardware as hw

NODE = "0x" + "ab" * 20


def honest(n: int, precision: str, challenge_id: str | None = None, node: str = NODE):
    cid = challenge_id or secrets.token_hex(32)
    a, b = hw.matrices(cid, node, n, precision)
    c = hw.multiply(a, b, precision)
    levels = hw.merkle_levels(c)
    return a, b, c, levels, levels[-1][0].hex()


@pytest.mark.parametrize("precision", hw.PRECISIONS)
def test_honest_answers_pass_at_every_size_with_a_wide_margin(precision: str) -> None:
    """200 challenges a precision at sizes 1..300 (odd sizes: the Merkle tree carries nodes up). The
    honest error stays under a quarter of the tolerance; docs/hardware.md has the figure at 1000+."""
    draw = np.random.default_rng(7)
    worst = 0.0
    for size in [1, 2, 3, 5, 17, 64, 255, 300] + [int(s) for s in draw.integers(1, 200, 192)]:
        a, b, c, levels, root = honest(size, precision)
        probe = hw.probe(secrets.token_bytes(32), size)
        result = hw.check(a, b, precision, root, probe, *hw.answer(c, levels, probe))
        assert result.ok, (size, result.reasons)
        worst = max(worst, result.worst)
    assert worst < 0.25


def test_the_challenge_is_bound_to_its_id_and_node() -> None:
    a1, b1 = hw.matrices("0" * 64, NODE, 8, "float32")
    a2, _ = hw.matrices("0" * 64, "0x" + "cd" * 20, 8, "float32")
    a3, _ = hw.matrices("1" + "0" * 63, NODE, 8, "float32")
    again, _ = hw.matrices("0" * 64, NODE.upper().replace("0X", "0x"), 8, "float32")
    assert not np.array_equal(a1, a2) and not np.array_equal(a1, a3)
    assert np.array_equal(a1, again)  # the address's case does not matter
    assert np.all(np.abs(a1) <= 1) and np.all(np.abs(b1) <= 1)


def test_bfloat16_and_float16_rounding_match_torch() -> None:
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).standard_normal(10_000).astype(np.float32) * 100
    for precision, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        ours = hw.round_to(x, precision)
        theirs = torch.from_numpy(x).to(dtype).to(torch.float32).numpy()
        assert np.array_equal(ours, theirs), precision


def test_a_product_of_other_matrices_is_caught() -> None:
    """A product computed for another challenge (a replayed answer, or another node's)."""
    n = 128
    a, b, *_ = honest(n, "float32", "a" * 64)
    _, _, c, levels, root = honest(n, "float32", "b" * 64)
    probe = hw.probe(b"s" * 32, n)
    result = hw.check(a, b, "float32", root, probe, *hw.answer(c, levels, probe))
    assert not result.ok and any(r.startswith("freivalds") for r in result.reasons)
    assert sum("not A's row" in r for r in result.reasons) == len(probe.rows)


def test_a_cheap_answer_without_the_product_is_caught_on_the_rows() -> None:
    """The liar commits to garbage fast, then answers C·r with A·(B·r) (O(n²), right by Freivalds) and
    opens garbage rows: each opened row contradicts both the answer and A·B."""
    n = 96
    a, b, *_ = honest(n, "float32")
    garbage = np.random.default_rng(3).uniform(-1, 1, (n, n)).astype(np.float32)
    levels = hw.merkle_levels(garbage)
    probe = hw.probe(secrets.token_bytes(32), n)
    _, rows, proofs = hw.answer(garbage, levels, probe)
    cr = (a.astype(np.float64) @ (b.astype(np.float64) @ probe.vector)).tolist()
    result = hw.check(a, b, "float32", levels[-1][0].hex(), probe, cr, rows, proofs)
    assert not any(r.startswith("freivalds") for r in result.reasons)
    assert sum("its product with r" in r for r in result.reasons) == len(probe.rows)


def test_a_product_partly_skipped_is_caught_as_often_as_the_rows_say() -> None:
    """A liar computing 3/4 of C's rows passes only when no opened row is a skipped one: (3/4)^8 ≈ 10 %."""
    n, precision = 64, "float32"
    passed = 0
    trials = 200
    for trial in range(trials):
        a, b, c, *_ = honest(n, precision)
        c = c.copy()
        c[np.random.default_rng(trial).choice(n, n // 4, replace=False)] = 0.0
        levels = hw.merkle_levels(c)
        probe = hw.probe(secrets.token_bytes(32), n)
        passed += hw.check(a, b, precision, levels[-1][0].hex(), probe, *hw.answer(c, levels, probe)).ok
    assert passed / trials < 0.25  # expected ≈ 0.09 (hypergeometric, 8 of 64 rows, 16 skipped)


def test_rows_and_proofs_that_are_not_the_committed_ones_are_refused() -> None:
    n = 33
    a, b, c, levels, root = honest(n, "float32")
    probe = hw.probe(b"k" * 32, n)
    cr, rows, proofs = hw.answer(c, levels, probe)
    swapped = [rows[1], rows[0], *rows[2:]]
    result = hw.check(a, b, "float32", root, probe, cr, swapped, proofs)
    assert "Merkle proof" in result.reasons[0]
    broken = [["zz" * 32] + p[1:] for p in proofs]
    assert not hw.check(a, b, "float32", root, probe, cr, rows, broken).ok
    assert not hw.check(a, b, "float32", root, probe, cr, [r[:-1] for r in rows], proofs).ok
    nan = [float("nan")] + cr[1:]
    with_nan = hw.check(a, b, "float32", root, probe, nan, rows, proofs)
    assert any(r.startswith("freivalds") for r in with_nan.reasons)
    short = hw.check(a, b, "float32", root, probe, cr[:-1], rows, proofs)
    assert not short.ok and short.reasons[0].startswith("answer shape")


def test_a_product_in_a_lower_precision_than_asked_is_caught() -> None:
    """bf16 arithmetic passed off as float32: off by ~2^-8 relative, hundreds of tolerances."""
    n = 256
    a, b, *_ = honest(n, "float32")
    low = hw.round_to(a @ b, "bfloat16")
    levels = hw.merkle_levels(low)
    probe = hw.probe(secrets.token_bytes(32), n)
    assert not hw.check(a, b, "float32", levels[-1][0].hex(), probe, *hw.answer(low, levels, probe)).ok


def test_sizes_and_precisions_out_of_range_are_named() -> None:
    with pytest.raises(hw.ChallengeError, match="between 1 and 8192"):
        hw.matrices("0" * 64, NODE, 0, "float32")
    with pytest.raises(hw.ChallengeError, match="use one of float32, float16, bfloat16"):
        hw.matrices("0" * 64, NODE, 4, "float64")


def test_proven_flops_is_a_lower_bound_from_time() -> None:
    assert hw.proven_flops(1000, 2.0) == pytest.approx(1e9)
    assert hw.proven_flops(10, 0.0) > 0
