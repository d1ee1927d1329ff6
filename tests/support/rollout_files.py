"""Synthetic rollout files for the trainer's tests and benches: random tokens of the shipped tokenizer's
vocabulary, groups whose rewards are half 1 and half 0 (every group informative, so every row trains),
made for a given trainer step. What the trainer reads of a file, nothing a validator would accept."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workloads.rollouts import BatchInfo, Rollout, write_rollouts
from workloads.trainer.grpo import group_advantages


def write_files(folder: Path, count: int, seed: int, step: int = 0, rows: int = 32, group: int = 4) -> None:
    """`count` rollout files of `rows` random rows in groups of `group`, each group's rewards mixed, made
    for trainer step `step` (the trainer takes a file at that step or later, never before)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for f in range(count):
        rewards = np.tile([1.0, 0.0], rows // 2)
        for g in range(0, rows, group):
            rng.shuffle(rewards[g : g + group])
        advantages = group_advantages(rewards, group)
        made = []
        for i in range(rows):
            length = int(rng.integers(2, 13))
            made.append(Rollout(
                input_tokens=rng.integers(3, 98, int(rng.integers(4, 16))).tolist(),
                output_tokens=rng.integers(3, 98, length).tolist(), output_logprobs=[-1.0] * length,
                advantages=advantages[i], rewards=rewards[i], task_rewards=rewards[i], length_penalties=0.0,
                proofs=b"", step=step, target_lengths=8, task_type="synthetic", seed=i, temperature=1.0,
                problem_id=f"p{i // group}"))  # fmt: skip
        info = BatchInfo(node_address="0x" + "1" * 40, step=step, batch_counter=f + 1, group_size=group,
                         max_new_tokens=16)  # fmt: skip
        write_rollouts(folder / f"s{seed}-{f}.parquet", made, info)
