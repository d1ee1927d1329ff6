"""Deterministic batch plans (the INTELLECT-2 fixed data sampling, with the step left out).

rng = numpy.random.default_rng([int(node_address, 16) * batch_counter, salt]) (salt: the first 16
bytes of sha256(task id) as an integer; outside a task, `default_rng(int(node_address, 16) *
batch_counter)`); then, in this order:
  indexes        = rng.integers(0, len(dataset), batch_size)        prompts of the batch
  seeds          = rng.integers(0, 2**63 - 1, batch_size * n)      one sampling seed per completion
  target_lengths = rng.choice(target_lengths, batch_size)           one target length per prompt
Rows of a file are prompt-major: completions j = 0..n-1 of prompt i are row i*n + j with seed
seeds[i*n + j]. The batch counter starts at 1 and counts every file the node makes for the task,
across steps (it never restarts), so a validator reproduces every prompt and seed from (task, node
address, batch counter).

Why the step is not in the plan: a node may label a batch with any step of the trainer's async window,
and a plan that depended on the label gave it up to `async_level + 1` different batches to choose the
best of (measured: task reward 0.469 against 0.375 and 0.406 for the labels it passed over). Without
the step, a label changes only which checkpoint generated the batch (the prompts and sampling seeds
stay), and a node's checkpoints may not go back (docs/validator.md, "Selection"). And a counter that
never restarts means a node cannot end a step before a bad batch and start the next step afresh: the
bad batch is still its next counter.
"""

from __future__ import annotations

import hashlib

import numpy as np
from pydantic import BaseModel, Field

SEED_HIGH = 2**63 - 1


class BatchPlan(BaseModel):
    indexes: list[int]
    seeds: list[int]
    target_lengths: list[int]
    n: int = Field(ge=1)


def batch_rng(node_address: str, batch_counter: int, task_id: str = "") -> np.random.Generator:
    if batch_counter < 1:
        raise ValueError("batch_counter starts at 1")
    try:
        node = int(node_address, 16)
    except ValueError:
        raise ValueError(
            f"node address {node_address!r} is not hex (expected 0x followed by 40 hex digits)"
        ) from None
    if not task_id:
        return np.random.default_rng(node * batch_counter)
    salt = int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:16], "big")
    return np.random.default_rng([node * batch_counter, salt])


def plan_batch(
    node_address: str,
    batch_counter: int,
    dataset_size: int,
    batch_size: int,
    n: int,
    target_lengths: list[int],
    task_id: str = "",
) -> BatchPlan:
    if dataset_size < 1 or batch_size < 1 or n < 1 or not target_lengths:
        raise ValueError("dataset_size, batch_size, n and target_lengths must all be positive / non-empty")
    rng = batch_rng(node_address, batch_counter, task_id)
    indexes = rng.integers(0, dataset_size, batch_size)
    seeds = rng.integers(0, SEED_HIGH, batch_size * n, dtype=np.int64)
    targets = rng.choice(np.asarray(target_lengths, dtype=np.int64), batch_size)
    return BatchPlan(
        indexes=[int(i) for i in indexes],
        seeds=[int(s) for s in seeds],
        target_lengths=[int(t) for t in targets],
        n=n,
    )
