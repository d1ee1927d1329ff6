"""Deterministic batch plans (the INTELLECT-2 fixed data sampling).

rng = numpy.random.default_rng(int(node_address, 16) * batch_counter + step); then, in this order:
  indexes        = rng.integers(0, len(dataset), batch_size)        prompts of the batch
  seeds          = rng.integers(0, 2**63 - 1, batch_size * n)      one sampling seed per completion
  target_lengths = rng.choice(target_lengths, batch_size)           one target length per prompt
Rows of a file are prompt-major: completions j = 0..n-1 of prompt i are row i*n + j with seed
seeds[i*n + j]. The batch counter starts at 1 and restarts at 1 whenever the step changes, so a
validator reproduces every prompt and seed from (node address, step, batch counter).
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


def batch_rng(node_address: str, batch_counter: int, step: int, task_id: str = "") -> np.random.Generator:
    if batch_counter < 1:
        raise ValueError("batch_counter starts at 1")
    try:
        node = int(node_address, 16)
    except ValueError:
        raise ValueError(
            f"node address {node_address!r} is not hex (expected 0x followed by 40 hex digits)"
        ) from None
    if not task_id:
        return np.random.default_rng(node * batch_counter + step)
    salt = int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:16], "big")
    return np.random.default_rng([node * batch_counter + step, salt])


def plan_batch(
    node_address: str,
    step: int,
    batch_counter: int,
    dataset_size: int,
    batch_size: int,
    n: int,
    target_lengths: list[int],
    task_id: str = "",
) -> BatchPlan:
    if dataset_size < 1 or batch_size < 1 or n < 1 or not target_lengths:
        raise ValueError("dataset_size, batch_size, n and target_lengths must all be positive / non-empty")
    rng = batch_rng(node_address, batch_counter, step, task_id)
    indexes = rng.integers(0, dataset_size, batch_size)
    seeds = rng.integers(0, SEED_HIGH, batch_size * n, dtype=np.int64)
    targets = rng.choice(np.asarray(target_lengths, dtype=np.int64), batch_size)
    return BatchPlan(
        indexes=[int(i) for i in indexes],
        seeds=[int(s) for s in seeds],
        target_lengths=[int(t) for t in targets],
        n=n,
    )
