"""Ways a dishonest worker cheats, for demos and the validator's end-to-end tests (`--cheat NAME`).

Never for production: each mode writes a file that looks like honest work but is not, so that the
network can show it catches them. Applied after honest generation (or, for the model, before it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch
from transformers import PreTrainedModel

from workloads.inference.generate import group_advantages
from workloads.model.loading import load_model, load_weights
from workloads.rollouts import Rollout

Cheat = Literal["none", "forged-reward", "perturbed-model", "inflated-units"]


def forge_rewards(rows: list[Rollout], group_size: int) -> list[Rollout]:
    """Claim every answer right, with rewards and advantages made consistent, as a careful forger would."""
    rows = [r.model_copy(update={"task_rewards": 1.0}) for r in rows]
    rewards = np.array([r.task_rewards - r.length_penalties for r in rows])
    groups = range(0, len(rows), group_size)
    adv = np.concatenate([group_advantages(rewards[g : g + group_size]) for g in groups])
    return [
        r.model_copy(update={"rewards": float(w), "advantages": float(a)})
        for r, w, a in zip(rows, rewards, adv, strict=True)
    ]


def perturb_model(model: PreTrainedModel, scale: float = 1e-2, seed: int = 3) -> None:
    """Serve slightly different weights than the checkpoint claimed: N(0, scale) on one matrix."""
    generator = torch.Generator().manual_seed(seed)
    weight = next(p for n, p in model.named_parameters() if n.endswith("q_proj.weight"))
    with torch.no_grad():
        noise = torch.randn(weight.shape, generator=generator) * scale  # drawn on the CPU: the same anywhere
        weight.add_(noise.to(weight.device, weight.dtype))


def perturbed_state(model: str, weights: str | Path | None = None) -> dict[str, torch.Tensor]:
    """The perturbed-model cheat's weights for an engine that takes a state dict (the vLLM backend):
    the model (or the checkpoint `weights`) in bf16 with `perturb_model` applied."""
    torch_model = load_model(model)
    if weights is not None:
        load_weights(torch_model, weights)
    perturb_model(torch_model)
    return dict(torch_model.state_dict())


def claimed_units(tokens: int, cheat: Cheat) -> int:
    """Work units announced for a file: inflated tenfold by the inflated-units cheat."""
    return tokens * 10 if cheat == "inflated-units" else tokens
