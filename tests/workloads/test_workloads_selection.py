"""Deterministic prompt selection and seeds (INTELLECT-2's formula, without the step: see selection.py)."""

from __future__ import annotations

import numpy as np
import pytest

from workloads.inference.selection import SEED_HIGH, plan_batch

NODE = "0x5aeda56215b167893e80b4fe645ba6d5bab767de"


def test_matches_the_formula():
    plan = plan_batch(
        NODE, batch_counter=3, dataset_size=512, batch_size=8, n=4, target_lengths=[8, 16]
    )
    rng = np.random.default_rng(int(NODE, 16) * 3)
    assert plan.indexes == rng.integers(0, 512, 8).tolist()
    assert plan.seeds == rng.integers(0, SEED_HIGH, 32, dtype=np.int64).tolist()
    assert plan.target_lengths == rng.choice(np.array([8, 16]), 8).tolist()
    assert len(set(plan.seeds)) == 32


def test_repeatable_and_distinct_across_counter_node_task():
    args = dict(dataset_size=512, batch_size=8, n=2, target_lengths=[8])
    a = plan_batch(NODE, 1, **args)
    assert a == plan_batch(NODE, 1, **args)
    assert a != plan_batch(NODE, 2, **args)
    assert a != plan_batch("0x" + "11" * 20, 1, **args)
    assert a != plan_batch(NODE, 1, **args, task_id="task-a") != plan_batch(NODE, 1, **args, task_id="task-b")


def test_bad_inputs():
    with pytest.raises(ValueError, match="hex"):
        plan_batch("node-1", 1, 10, 2, 2, [8])
    with pytest.raises(ValueError, match="batch_counter"):
        plan_batch(NODE, 0, 10, 2, 2, [8])
