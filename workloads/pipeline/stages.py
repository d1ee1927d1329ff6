"""A model cut into pipeline stages: each group member loads and runs only its own layers.

Stage i of n holds decoder layers `layers` (contiguous) and, for the first stage, the token embedding;
the last stage holds the final norm and the LM head (and the embedding too when the head is tied to
it). A stage is a causal LM of its own class with `len(layers)` layers, filled from the checkpoint's
safetensors by name (`model.layers.<global i>` → `model.layers.<local i>`): nothing of the other
stages is ever read into memory. A non-last stage's output is the residual stream after its last
layer (its final norm is the identity); the last stage's is the final norm's output, the activations
single-node TOPLOC proofs commit to, so a group's rollout file has exactly a single node's proofs.

The activations a stage *sends* are what its proofs commit to, at the decode positions (one per
output token but the last, as `TorchBackend` captures them): the validator recomputes them with one
full-model prefill (`boundary_activations`) and finds the first stage whose proofs do not match.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from workloads.model.hooks import final_norm
from workloads.model.loading import resolve


class StageError(ValueError):
    """A topology or checkpoint that cannot be split as asked."""


def split_layers(layers: int, members: int) -> list[range]:
    """Contiguous layer ranges, one per member, the earlier members taking the remainder first
    (4 layers: 2 → 2+2, 3 → 2+1+1). Every member gets at least one layer."""
    if members < 1:
        raise StageError("a group needs at least one member")
    if members > layers:
        raise StageError(f"{members} members for {layers} layers: each member needs at least one layer")
    base, extra = divmod(layers, members)
    out, start = [], 0
    for i in range(members):
        size = base + (1 if i < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


@dataclass(frozen=True)
class StagePlan:
    index: int
    members: int
    layers: range

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.members - 1


def plan_stages(model: str | Path | None, members: int) -> list[StagePlan]:
    config = AutoConfig.from_pretrained(resolve(model))
    return [StagePlan(i, members, r) for i, r in enumerate(split_layers(config.num_hidden_layers, members))]


class Stage:
    """One member's part of the model, ready to run decode steps with its own KV cache."""

    def __init__(self, plan: StagePlan, model: PreTrainedModel) -> None:
        self.plan = plan
        self.model = model
        self.hidden_size = int(model.config.hidden_size)
        self.vocab_size = int(model.config.vocab_size)

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @torch.inference_mode()
    def forward(
        self, x: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache: object | None
    ) -> tuple[torch.Tensor, object]:
        """token ids [B, T] (first stage) or activations [B, T, H] → this stage's output [B, T, H] and
        its cache. The last stage's output is the final norm's; `logits` turns its last position into
        the next token's logits."""
        kwargs = {"input_ids": x} if self.plan.first else {"inputs_embeds": x}
        out = self.model.model(attention_mask=attention_mask, position_ids=position_ids,
                               past_key_values=cache, use_cache=True, **kwargs)  # fmt: skip
        return out.last_hidden_state, out.past_key_values

    @torch.inference_mode()
    def logits(self, hidden_last: torch.Tensor) -> torch.Tensor:
        if not self.plan.last:
            raise StageError("only the last stage has the LM head")
        return self.model.lm_head(hidden_last)


def load_stage(model: str | Path | None, plan: StagePlan, weights: str | Path | None = None,
               dtype: torch.dtype = torch.bfloat16) -> Stage:  # fmt: skip
    """Build stage `plan` of `model` (a local folder with config.json; `weights`: a safetensors
    checkpoint of the whole model, default the folder's model.safetensors), reading only its tensors."""
    source = Path(resolve(model))
    full = AutoConfig.from_pretrained(source)
    config = copy.deepcopy(full)
    config.num_hidden_layers = len(plan.layers)
    if getattr(full, "layer_types", None):
        config.layer_types = list(full.layer_types)[plan.layers.start : plan.layers.stop]
    with torch.device("meta"):
        shell = AutoModelForCausalLM.from_config(config, dtype=dtype)
    tied = bool(getattr(full, "tie_word_embeddings", False))
    wanted: dict[str, str] = {}
    path = Path(weights) if weights is not None else source / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
            local = _local_name(name, plan, tied)
            if local is not None:
                wanted[local] = name
        state = {local: f.get_tensor(name).to(dtype) for local, name in wanted.items()}
    if plan.last and tied and "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    needed = {k for k in shell.state_dict() if _needed(k, plan)}
    missing = sorted(needed - state.keys())
    if missing:
        raise StageError(f"{path} lacks tensors stage {plan.index} needs: {missing[:5]}")
    for name in [k for k in shell.state_dict() if k not in needed]:
        _drop(shell, name)  # not this stage's: an empty tensor, never read from the file
    shell.load_state_dict({k: state[k] for k in needed}, strict=False, assign=True)
    if not plan.last:
        shell.model.norm = nn.Identity()
    shell.model.rotary_emb = type(shell.model.rotary_emb)(config=config)  # buffers built, not loaded
    return Stage(plan, shell.eval())


def _local_name(name: str, plan: StagePlan, tied: bool) -> str | None:
    if name.startswith("model.layers."):
        index = int(name.split(".")[2])
        if index in plan.layers:
            rest = name.split(".", 3)[3]
            return f"model.layers.{index - plan.layers.start}.{rest}"
        return None
    if name == "model.embed_tokens.weight":
        return name if plan.first or (plan.last and tied) else None
    if name in ("model.norm.weight", "lm_head.weight"):
        return name if plan.last else None
    return None


def _needed(local: str, plan: StagePlan) -> bool:
    if local.startswith("model.layers."):
        return True
    if local == "model.embed_tokens.weight":
        return plan.first
    return plan.last and local in ("model.norm.weight", "lm_head.weight")


def _drop(model: nn.Module, name: str) -> None:
    owner_name, _, attr = name.rpartition(".")
    owner = model.get_submodule(owner_name)
    old = getattr(owner, attr)
    setattr(owner, attr, nn.Parameter(torch.empty(0, dtype=old.dtype), requires_grad=False))


@contextmanager
def boundary_activations(
    model: PreTrainedModel, plans: list[StagePlan]
) -> Iterator[list[list[torch.Tensor]]]:
    """During a full-model forward, what each stage would send: the output of its last layer (the
    last stage: the final norm's output). `captured[i]` collects stage i's, one tensor per forward."""
    captured: list[list[torch.Tensor]] = [[] for _ in plans]
    handles = []
    layers = model.get_decoder().layers
    for plan in plans:
        module = final_norm(model) if plan.last else layers[plan.layers.stop - 1]

        def hook(_m: nn.Module, _i: tuple, output: object, i: int = plan.index) -> None:
            tensor = output[0] if isinstance(output, tuple) else output
            assert isinstance(tensor, torch.Tensor)
            captured[i].append(tensor.detach())

        handles.append(module.register_forward_hook(hook))
    try:
        yield captured
    finally:
        for h in handles:
            h.remove()
