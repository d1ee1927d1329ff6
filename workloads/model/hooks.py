"""Capture the final-norm output (the input of lm_head), the activations TOPLOC commits to."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def final_norm(model: nn.Module) -> nn.Module:
    """The last normalisation before lm_head for Llama/Qwen/Mistral-style models (`model.model.norm`)
    and GPT-2-style ones (`transformer.ln_f`)."""
    get_decoder = getattr(model, "get_decoder", None)  # transformers models; nn.Module has none
    base = get_decoder() if callable(get_decoder) else model
    for name in ("norm", "final_layernorm", "ln_f"):
        if isinstance(getattr(base, name, None), nn.Module):
            return getattr(base, name)
    raise ValueError(f"cannot find the final norm of {type(model).__name__}; expected decoder.norm or ln_f")


@contextmanager
def capture_final_norm(model: nn.Module, last_only: bool) -> Iterator[list[torch.Tensor]]:
    """Collect the final norm's output of every forward inside the block: the last position only
    (decode steps) or every position (prefill)."""
    captured: list[torch.Tensor] = []

    def hook(_module: nn.Module, _inputs: tuple, output: torch.Tensor) -> None:
        captured.append((output[:, -1, :] if last_only else output).detach())

    handle = final_norm(model).register_forward_hook(hook)
    try:
        yield captured
    finally:
        handle.remove()
