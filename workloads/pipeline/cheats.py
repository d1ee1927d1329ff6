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
"""

from __future__ import annotations

import torch

from workloads.pipeline.stages import Stage

FORWARDER_CHEATS = ("noise", "noise-unproven", "other-prompt", "sign-flip", "negate", "small-flip")


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
    return out


def perturb_stage(stage: Stage, scale: float = 1e-2, seed: int = 3) -> None:
    """N(0, scale) on one matrix of the member's own layers."""
    weight = next(p for n, p in stage.model.named_parameters() if n.endswith("q_proj.weight"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight.add_((torch.randn(weight.shape, generator=g) * scale).to(weight.dtype))
