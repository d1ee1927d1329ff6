"""One batch of rollouts: plan → generate → score → advantages and length penalties → proofs."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from workloads.inference.selection import BatchPlan
from workloads.model.backends import Completion, InferenceBackend
from workloads.rollouts import Rollout
from workloads.verifiers import TaskRecord, score


@dataclass
class BatchTimings:
    generate: float
    score: float
    proofs: float


def group_advantages(rewards: np.ndarray) -> np.ndarray:
    """(r - mean) / (std + 1e-6) within the group (population std); all-equal groups give zeros."""
    return (rewards - rewards.mean()) / (rewards.std() + 1e-6)


def rewards_for(tasks: list[TaskRecord], texts: list[str], lengths: list[int], targets: list[int], n: int,
                length_penalty: float) -> tuple[list[float], list[float], list[float], list[float]]:
    """(task rewards, length penalties, rewards, advantages) of rows prompt-major in groups of `n`
    (`tasks` one per prompt): the verifier's score, minus `length_penalty` × |length − target|, and
    the group-normalised advantage. One function for every workload, so a group's batch is scored
    exactly as one node's."""
    task_rewards = np.array([score(tasks[r // n], text) for r, text in enumerate(texts)], dtype=np.float64)
    penalties = length_penalty * np.abs(np.asarray(lengths) - np.asarray(targets))
    rewards = task_rewards - penalties
    advantages = np.concatenate([group_advantages(rewards[g : g + n]) for g in range(0, len(rewards), n)])
    return ([float(x) for x in task_rewards], [float(x) for x in penalties], [float(x) for x in rewards],
            [float(x) for x in advantages])  # fmt: skip


def proofs_for(completions: list[Completion]) -> list[bytes]:
    # One batched call: the modulus search and interpolation run once over every chunk of the batch.
    from workloads.toploc.proof import build_proofs_batch  # noqa: PLC0415 - proofs are optional

    streamed = [c.proof for c in completions if c.proof is not None]
    if completions and len(streamed) == len(completions):
        return streamed  # built while decoding (stream_proofs)
    hiddens = [c.hidden for c in completions if c.hidden is not None]
    if len(hiddens) != len(completions):
        raise ValueError("proofs need hidden states: generate with capture_hidden=True")
    return build_proofs_batch(hiddens)


def completion_text(tokenizer: PreTrainedTokenizerBase, tokens: list[int]) -> str:
    """The text a verifier scores: the completion decoded without special tokens (EOS). `decode` is
    typed `str | list[str]` because it also decodes batches; one sequence of ids is one string."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    if not isinstance(text, str):
        raise TypeError(f"decoding one sequence gave {type(text).__name__}, not str")
    return text


def make_rollouts(
    backend: InferenceBackend,
    tokenizer: PreTrainedTokenizerBase,
    records: list[TaskRecord],
    plan: BatchPlan,
    *,
    step: int,
    max_new_tokens: int,
    temperature: float,
    length_penalty: float,
    with_proofs: bool = True,
    stream_proofs: bool = False,
) -> tuple[list[Rollout], BatchTimings]:
    """`stream_proofs` (TorchBackend) builds proofs on a background thread while decoding; otherwise
    they are built after decoding in one batched call. Same bytes either way."""
    tasks = [records[i] for i in plan.indexes]
    prompts = [tokenizer(t.prompt)["input_ids"] for t in tasks]
    rows_prompt = [p for p in prompts for _ in range(plan.n)]
    t0 = time.perf_counter()
    completions = backend.generate(
        rows_prompt,
        plan.seeds,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        capture_hidden=with_proofs,
        **({"stream_proofs": True} if with_proofs and stream_proofs else {}),
    )
    t1 = time.perf_counter()
    targets = [t for t in plan.target_lengths for _ in range(plan.n)]
    task_rewards, penalties, rewards, advantages = rewards_for(
        tasks, [completion_text(tokenizer, c.tokens) for c in completions],
        [len(c.tokens) for c in completions], targets, plan.n, length_penalty,
    )  # fmt: skip
    t2 = time.perf_counter()
    proofs = proofs_for(completions) if with_proofs else [b""] * len(completions)
    t3 = time.perf_counter()
    rollouts = [
        Rollout(
            input_tokens=rows_prompt[r],
            output_tokens=c.tokens,
            output_logprobs=c.logprobs,
            advantages=float(advantages[r]),
            rewards=float(rewards[r]),
            task_rewards=float(task_rewards[r]),
            length_penalties=float(penalties[r]),
            proofs=proofs[r],
            step=step,
            target_lengths=int(targets[r]),
            task_type=tasks[r // plan.n].task_type,
            seed=plan.seeds[r],
            temperature=temperature,
            problem_id=tasks[r // plan.n].problem_id,
        )
        for r, c in enumerate(completions)
    ]
    return rollouts, BatchTimings(generate=t1 - t0, score=t2 - t1, proofs=t3 - t2)


DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
