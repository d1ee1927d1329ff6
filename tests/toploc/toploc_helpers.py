"""Shared helpers for the TOPLOC tests: seeded activations and a tiny real torch network."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def activations(rows: int, hidden: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, hidden, generator=g) * scale).to(torch.bfloat16)


def relative_noise(hidden: torch.Tensor, level: float, seed: int = 1) -> torch.Tensor:
    """hidden x (1 + level x N(0, 1)): a perturbation proportional to each value."""
    g = torch.Generator().manual_seed(seed)
    x = hidden.float()
    return (x * (1 + level * torch.randn(x.shape, generator=g))).to(torch.bfloat16)


def tiny_transformer(seed: int, hidden: int = 128, layers: int = 4) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)

    def mk(a: int, b: int) -> torch.Tensor:
        return torch.randn(a, b, generator=g) / a**0.5

    return [
        dict(
            q=mk(hidden, hidden),
            k=mk(hidden, hidden),
            v=mk(hidden, hidden),
            o=mk(hidden, hidden),
            up=mk(hidden, 3 * hidden),
            down=mk(3 * hidden, hidden),
        )
        for _ in range(layers)
    ]


def final_hidden(weights: list[dict[str, torch.Tensor]], x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Causal pre-norm transformer run in `dtype`; returns the final-norm output (lm_head input)."""
    h = x.to(dtype)
    n, d = h.shape
    mask = torch.full((n, n), float("-inf")).triu(1).to(dtype)
    for layer in weights:
        w = {k: v.to(dtype) for k, v in layer.items()}
        a = F.rms_norm(h, (d,))
        att = F.softmax((a @ w["q"]) @ (a @ w["k"]).T / d**0.5 + mask, dim=-1) @ (a @ w["v"])
        h = h + att @ w["o"]
        h = h + F.silu(F.rms_norm(h, (d,)) @ w["up"]) @ w["down"]
    return F.rms_norm(h, (d,))
