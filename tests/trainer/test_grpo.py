"""GRPO against hand-computed values: advantages, filtering, clipping on both sides, the δ cap, k3 KL."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from workloads.trainer.grpo import GrpoConfig, group_advantages, grpo_loss, informative_groups

CFG = GrpoConfig(epsilon=0.2, delta=4.0, kl_coef=0.0, entropy_coef=0.0)


def one_token(ratio: float, adv: float, cfg: GrpoConfig = CFG, ref_minus_logp: float = 0.0,
              entropy: float = 0.0) -> float:  # fmt: skip
    old = torch.zeros((1, 1))
    logp = torch.full((1, 1), math.log(ratio))
    ref = logp + ref_minus_logp
    loss, _ = grpo_loss(logp, old, ref, torch.full((1, 1), entropy), torch.tensor([adv]),
                        torch.ones((1, 1), dtype=torch.bool), cfg)  # fmt: skip
    return float(loss)


def test_group_advantages_by_hand() -> None:
    adv = group_advantages(np.array([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5]), 4)
    # group 1: mean 0.5, std 0.5 → ±1 (less the 1e-6 in the denominator)
    assert np.allclose(adv[:4], [1, -1, -1, 1], atol=1e-5)
    assert np.allclose(adv[4:], 0.0)
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(np.zeros(6), 4)


def test_informative_groups_drop_equal_rewards() -> None:
    mask = informative_groups(np.array([1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0.0]), 4)
    assert mask.tolist() == [False, True, False]


@pytest.mark.parametrize(
    ("ratio", "adv", "expected"),
    [
        (1.0, 1.0, -1.0),  # on-policy: −A
        (1.5, 1.0, -1.2),  # A > 0: gain capped at 1 + ε
        (0.5, 1.0, -0.5),  # A > 0, ratio below 1 − ε: the unclipped (pessimistic) term
        (0.5, -1.0, 0.8),  # A < 0: loss held at (1 − ε)·|A|
        (1.5, -1.0, 1.5),  # A < 0, ratio above 1 + ε: the unclipped term
        (10.0, -1.0, 4.0),  # A < 0 and far off-policy: capped at δ
        (10.0, 2.0, -2.4),  # A > 0: the δ cap changes nothing, the clip binds
    ],
)
def test_two_sided_clipping_and_delta_cap(ratio: float, adv: float, expected: float) -> None:
    assert one_token(ratio, adv) == pytest.approx(expected, rel=1e-5)


def test_k3_kl_and_entropy_terms() -> None:
    cfg = GrpoConfig(epsilon=0.2, delta=4.0, kl_coef=0.5, entropy_coef=0.1)
    d = 0.3  # ref − logp
    kl = math.exp(d) - d - 1
    assert one_token(1.0, 0.0, cfg, ref_minus_logp=d, entropy=2.0) == pytest.approx(
        0.5 * kl - 0.1 * 2.0, rel=1e-5
    )
    assert one_token(1.0, 0.0, cfg, ref_minus_logp=0.0) == pytest.approx(0.0, abs=1e-7)  # k3 is 0 at equality


def test_loss_is_a_token_mean_over_the_output_mask() -> None:
    logp = torch.log(torch.tensor([[1.0, 1.0, 1.5], [1.0, 1.0, 1.0]]))
    mask = torch.tensor([[False, True, True], [False, False, True]])
    loss, parts = grpo_loss(
        logp, torch.zeros(2, 3), logp, torch.zeros(2, 3), torch.tensor([1.0, -1.0]), mask, CFG
    )
    # tokens: (row 0: −1.0, −1.2), (row 1: +1.0) → mean −0.4
    assert float(loss) == pytest.approx(-0.4, rel=1e-5)
    assert parts["clip_fraction"] == pytest.approx(1 / 3)
