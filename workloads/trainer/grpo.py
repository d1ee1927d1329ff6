"""GRPO as trained in prime-rl (INTELLECT-2 era), written for clarity first.

- Advantage of a completion: (r − mean of its group) / (std of its group + 1e-6). The worker writes
  it into the rollout file and the validator recomputes it; groups whose rewards are all equal have
  zero advantage everywhere and teach nothing, so they are filtered out (and counted).
- Token-level loss with two-sided clipping: ratio = exp(logp − old_logp), capped at δ; per token
  max(−min(ratio, δ)·A, −clip(ratio, 1−ε, 1+ε)·A). The δ cap bounds the update when A < 0 and the
  policy has moved far from the one that produced the rollout (async level > 0).
- KL to the reference policy with the k3 estimator: exp(ref − logp) − (ref − logp) − 1 (≥ 0, unbiased).
- Entropy bonus: − c · entropy of the policy's next-token distribution.
Every term is averaged over all output tokens of the batch (token-level, not per sequence).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel


@dataclass(frozen=True)
class GrpoConfig:
    epsilon: float = 0.2
    delta: float = 4.0
    kl_coef: float = 0.001
    entropy_coef: float = 1e-4


def group_advantages(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """Per group of `group_size` consecutive completions of one prompt."""
    if len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    groups = np.asarray(rewards, dtype=np.float64).reshape(-1, group_size)
    mean = groups.mean(axis=1, keepdims=True)
    std = groups.std(axis=1, keepdims=True)
    return ((groups - mean) / (std + 1e-6)).reshape(-1)


def informative_groups(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """Mask of groups whose rewards are not all equal (the only ones with a learning signal)."""
    groups = np.asarray(rewards, dtype=np.float64).reshape(-1, group_size)
    return ~np.isclose(groups.max(axis=1), groups.min(axis=1))


@dataclass
class Batch:
    """Right-padded prompt+output token ids, with a mask over the output tokens (the ones scored)."""

    ids: torch.Tensor  # [B, T] long
    output_mask: torch.Tensor  # [B, T] bool: position t holds an output token
    advantages: torch.Tensor  # [B] float32


def make_batch(
    prompts: list[list[int]], outputs: list[list[int]], advantages: list[float], pad_token_id: int,
    device: torch.device | str = "cpu",
) -> Batch:  # fmt: skip
    """Built on the CPU (row by row), then moved to the trainer's device in one copy per tensor."""
    seqs = [p + o for p, o in zip(prompts, outputs, strict=True)]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
        ids[i, : len(p) + len(o)] = torch.tensor(p + o)
        mask[i, len(p) : len(p) + len(o)] = True
    return Batch(ids.to(device), mask.to(device), torch.tensor(advantages, dtype=torch.float32).to(device))


def token_logprobs_and_entropy(model: PreTrainedModel, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """logp of each token given its prefix, and the entropy of that next-token distribution, [B, T]
    (position t is about token t; position 0 holds zeros). Right padding needs no attention mask
    for a causal model: positions before the padding never see it."""
    logits = model(input_ids=batch.ids, use_cache=False).logits.float()
    logp_all = torch.log_softmax(logits[:, :-1], dim=-1)
    target = batch.ids[:, 1:]
    logp = logp_all.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    zeros = torch.zeros((batch.ids.shape[0], 1), dtype=logp.dtype, device=logp.device)
    return torch.cat([zeros, logp], dim=1), torch.cat([zeros, entropy], dim=1)


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: GrpoConfig,
    tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss over the masked (output) tokens and its parts. Shapes: [B, T] except advantages [B].
    `tokens`: what the sums are divided by, the mask's own count unless given: a rank of a sharded
    trainer holds part of a minibatch and divides by the whole minibatch's output tokens, so the ranks'
    losses and parts add up to the one-process values (workloads/trainer/sharded.py)."""
    adv = advantages.unsqueeze(-1).expand_as(logp)
    ratio = torch.exp(logp - old_logp)
    capped = torch.clamp(ratio, max=cfg.delta)
    clipped = torch.clamp(ratio, 1 - cfg.epsilon, 1 + cfg.epsilon)
    policy = torch.maximum(-capped * adv, -clipped * adv)
    diff = ref_logp - logp
    kl = torch.exp(diff) - diff - 1
    per_token = policy + cfg.kl_coef * kl - cfg.entropy_coef * entropy
    m = mask.float()
    n = m.sum().clamp(min=1.0) if tokens is None else torch.tensor(max(tokens, 1.0), device=m.device)
    loss = (per_token * m).sum() / n
    with torch.no_grad():
        was_clipped = ((ratio < 1 - cfg.epsilon) | (ratio > 1 + cfg.epsilon)) & mask
        parts = {
            "loss": float(loss),
            "policy_loss": float((policy * m).sum() / n),
            "kl": float((kl * m).sum() / n),
            "entropy": float((entropy * m).sum() / n),
            "clip_fraction": float(was_clipped.float().sum() / n),
        }
    return loss, parts
