"""What a dishonest member does instead of its part (tests, benches and the demo only; `options.CHEATS`).

Forwarders (a stage before the last, changing what it sends and proving what it sends):
- `noise`: N(0, 0.05·std) on every value; `noise-unproven`: the same, but its proofs are of its honest
  output (the receiver catches that at once);
- `other-prompt`: each row's activations sent as another row's;
- `sign-flip`: every value below its position's median negated; `negate`: the whole vector negated;
- `small-flip`: every value whose magnitude is below its position's median negated: none of them is
  ever among a chunk's top-k, so no TOPLOC proof of what it forwards can differ from its honest one.
Receivers: `false-accuse` says the sender's seal does not match what it received (it does);
`forge-received` countersigns the digest of frames it did not receive.
Drivers with a draft (`draft.py`): `over-keep` says one drafted position more counts than did (its
input was a wrong guess); `over-draft` sends trips two positions wider than the task's `draft_tokens`.
Others: `weights` (N(0, 1e-2) on one matrix of its layers), `skip` (its layers skipped), `forge-token`
(the last stage samples greedily), `wrong-plan` (a driver's own seeds).
Compute savers (issue 55: a cheaper computation paid as the claimed one; each proves what it sends):
`int8` (its layers' matrices quantized per output channel to int8 and back), `fp16` (its layers run in
float16, each layer's output cast back to bfloat16), `bias` / `half-bias` (+1 % / +0.5 % of each
position's RMS added to every value it forwards: the room the per-position rule left), `skip-layer`
(its last layer adds nothing: the output projections zeroed, so the residual passes through as if the
layer had not run). `change_stage` applies the stage-level ones when the member loads its layers.
"""

from __future__ import annotations

import torch
from torch import nn

from workloads.pipeline.stages import Stage

FORWARDER_CHEATS = ("noise", "noise-unproven", "other-prompt", "sign-flip", "negate", "small-flip", "bias",
                    "half-bias")
STAGE_CHEATS = ("weights", "int8", "fp16", "skip-layer")  # the member's layers changed (`change_stage`)
BIAS = {"bias": 0.01, "half-bias": 0.005}  # the share of each position's RMS added to every value


def tamper(cheat: str, out: torch.Tensor) -> torch.Tensor:
    """What a dishonest non-last member forwards instead of its output `out` [B, T, H]."""
    if cheat in ("noise", "noise-unproven"):
        g = torch.Generator().manual_seed(7)
        noisy = out.float() + torch.randn(out.shape, generator=g) * 0.05 * out.float().std()
        return noisy.to(out.dtype)
    if cheat == "other-prompt" and out.shape[0] > 1:
        return out.roll(1, dims=0)
    if cheat == "negate":
        return -out
    if cheat == "sign-flip":
        median = out.float().median(dim=-1, keepdim=True).values
        return torch.where(out.float() < median, -out, out)
    if cheat == "small-flip":
        small = out.float().abs() < out.float().abs().median(dim=-1, keepdim=True).values
        return torch.where(small, -out, out)
    if cheat in BIAS:  # a constant shift: exactly BIAS of each position's norm, in one direction
        rms = out.float().pow(2).mean(dim=-1, keepdim=True).sqrt()
        return (out.float() + BIAS[cheat] * rms).to(out.dtype)
    return out


def change_stage(cheat: str, stage: Stage) -> None:
    """The member's own layers as a stage-level cheat runs them (a no-op for any other cheat). Called
    whenever the member loads its layers, so a new checkpoint is changed the same way."""
    if cheat == "weights":
        perturb_stage(stage)
    elif cheat == "int8":
        quantize_layers(stage)
    elif cheat == "fp16":
        half_layers(stage)
    elif cheat == "skip-layer":
        skip_layer(stage)


def perturb_stage(stage: Stage, scale: float = 1e-2, seed: int = 3) -> None:
    """N(0, scale) on one matrix of the member's own layers."""
    weight = next(p for n, p in stage.model.named_parameters() if n.endswith("q_proj.weight"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight.add_((torch.randn(weight.shape, generator=g) * scale).to(weight.dtype))


def quantize_layers(stage: Stage, bits: int = 8) -> None:
    """Every matrix of its layers rounded per output channel to `bits`-bit integers and back (symmetric,
    round to nearest): what int8 kernels compute with, in place of the claimed bf16 weights."""
    levels = 2 ** (bits - 1) - 1
    with torch.no_grad():
        for p in stage.model.get_decoder().layers.parameters():
            if p.dim() >= 2:
                w = p.float()
                step = (w.abs().amax(dim=1, keepdim=True) / levels).clamp_min(1e-12)
                p.copy_((torch.round(w / step) * step).to(p.dtype))


def half_layers(stage: Stage) -> None:
    """Its layers in float16: weights cast once, each layer's inputs cast to float16 (a float mask
    clamped to float16's range, so masked positions stay finite) and its output cast back, so what
    goes between layers and on the wire is bfloat16 as an honest member's is."""
    layers = stage.model.get_decoder().layers
    layers.to(torch.float16)

    def half(value: object) -> object:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.clamp(torch.finfo(torch.float16).min, torch.finfo(torch.float16).max).half()
        if isinstance(value, tuple):
            return tuple(half(v) for v in value)
        return value

    def before(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return tuple(half(a) for a in args), {k: half(v) for k, v in kwargs.items()}

    def after(_m: nn.Module, _args: tuple, _kwargs: dict, output: object) -> object:
        if isinstance(output, tuple):
            return (output[0].to(torch.bfloat16), *output[1:])
        assert isinstance(output, torch.Tensor)
        return output.to(torch.bfloat16)

    for layer in layers:
        layer.register_forward_pre_hook(before, with_kwargs=True)
        layer.register_forward_hook(after, with_kwargs=True)


def skip_layer(stage: Stage) -> None:
    """Its last layer not run, in effect: the attention's and the MLP's output projections zeroed, so
    the layer adds nothing to the residual stream (its KV cache still fills, as the model expects)."""
    layer = stage.model.get_decoder().layers[-1]
    with torch.no_grad():
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
