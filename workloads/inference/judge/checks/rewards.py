"""Check 7: rewards and advantages recomputed with the task's verifier and the workload's own
formulas (workloads/inference/generate.py); a forged reward or advantage differs."""

from __future__ import annotations

import numpy as np

from workloads.inference.generate import completion_text, group_advantages
from workloads.inference.judge.checks.context import FileContext, rows_named
from workloads.verifiers import score


def rewards_and_advantages(ctx: FileContext) -> list[str]:
    task, th = ctx.task, ctx.thresholds
    by_id = {r.problem_id: r for r in ctx.records}
    task_rewards = np.array(
        [
            score(by_id[r.problem_id], completion_text(ctx.tokenizer, r.output_tokens))
            if r.problem_id in by_id
            else np.nan
            for r in ctx.rows
        ],
        dtype=np.float64,
    )
    lengths = np.array([len(r.output_tokens) for r in ctx.rows], dtype=np.float64)
    targets = np.array([r.target_lengths for r in ctx.rows], dtype=np.float64)
    penalties = task.length_penalty * np.abs(lengths - targets)
    rewards = task_rewards - penalties
    advantages = np.concatenate(
        [group_advantages(rewards[g : g + task.n]) for g in range(0, len(rewards), task.n)]
    )
    claimed = {
        "task reward": np.array([r.task_rewards for r in ctx.rows]),
        "length penalty": np.array([r.length_penalties for r in ctx.rows]),
        "reward": np.array([r.rewards for r in ctx.rows]),
        "advantage": np.array([r.advantages for r in ctx.rows]),
    }
    recomputed = {
        "task reward": task_rewards,
        "length penalty": penalties,
        "reward": rewards,
        "advantage": advantages,
    }
    reasons = []
    for what, values in claimed.items():
        tol = th.advantage_tolerance if what == "advantage" else th.reward_tolerance
        bad = [int(i) for i in np.flatnonzero(~(np.abs(values - recomputed[what]) <= tol))]
        if bad:
            i = bad[0]
            reasons.append(
                f"rewards: {rows_named(bad)} claim a {what} the verifier does not give "
                f"(row {i}: {values[i]:.4f} claimed, {recomputed[what][i]:.4f} recomputed)"
            )
    return reasons
