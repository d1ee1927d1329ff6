"""How far what a stage before the last sent may be from the replay of its layers (issue 55).

`replay.judge_member` replays a forwarding member's layers (one prefill) over exactly what it received
and measures, per real position, ‖sent − replay‖₂ / ‖replay‖₂ (float32 over the hidden vector). An
honest member differs from its replay only by bf16 rounding of decode steps against a prefill: on the
tiny model a position is off by 0.0085 at worst, and most prompt positions by nothing at all.

**Per position** (issue 36): the member is guilty when more than `share` of its positions are above
`position`, or one is above `worst`. That catches what a forwarder changes a lot (flipped signs,
another row, skipped layers, noise of 5 % of σ), but leaves it every change under `position` (5 % of
each vector's norm on the tiny model): room enough to forward what a cheaper computation makes (its
layers in int8: 0.7-0.9 % per position) or a systematic shift (+1 % of each position's RMS), and be
paid as the claimed one.

**Over the file** (issue 55): honest errors are small *on average* and point nowhere in particular
(bf16 rounding), while a cheaper computation moves every position and a shift moves every position
the same way. Two figures of the file's n real positions, each held to a limit that is loose for a
small file and tightens as 1/√n (a few positions say little; many say much):

    mean   = (1/n) Σ ‖sent − replay‖ / ‖replay‖        ≤ mean + spread / √n
    offset = ‖(1/n) Σ (sent − replay) / ‖replay‖‖      ≤ offset + offset_spread / √n

`mean` catches what is off everywhere (int8 layers); `offset` what is off in one direction (a bias:
+1 % of each position's RMS puts it at 0.01 at any n, where honest rounding cancels out to a few
10⁻⁴ over a few hundred positions). `spread` is the worst honest position (×margin): a one-position
file may be as far off as the worst honest position ever was; `offset_spread` the largest honest
offset × √n, at least the worst position (×margin); `mean` and `offset` the largest honest figures
(×margin) of any file (mean) and of files of `LARGE` positions or more (offset). So no honest file of
any size, down to a 1-row batch of 1-token outputs, is past either limit. The figures are the
model's (`ForwardLimits.from_record`, the `pipeline` part of its calibration record, made by
`tolerance_calibration.py`); a model without one is judged with the tiny model's (`TINY_FORWARD`),
and the plug-in then never slashes on them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

import torch

LARGE = 256  # positions from which a file's offset counts for the `offset` floor (tolerance_calibration)


@dataclass(frozen=True)
class ForwardLimits:
    """What judges a stage before the last, per real position and over the file (module doc)."""

    position: float  # a position above this is out
    share: float  # the stage is guilty when more than this share of its positions is out...
    worst: float  # ...or when one position is above this...
    mean: float = math.inf  # ...or when its mean error over n positions is above mean + spread / √n...
    spread: float = 0.0
    offset: float = math.inf  # ...or its offset above offset + offset_spread / √n
    offset_spread: float = 0.0

    def mean_limit(self, positions: int) -> float:
        """The most an honest file of `positions` real positions may be off on average."""
        return self.mean + self.spread / math.sqrt(max(1, positions))

    def offset_limit(self, positions: int) -> float:
        """The most an honest file's differences may add up to in one direction."""
        return self.offset + self.offset_spread / math.sqrt(max(1, positions))

    def figures(self) -> dict[str, float]:
        return asdict(self)

    def per_position(self) -> ForwardLimits:
        """These limits without the file rules: what judges a model no record calibrates (the per-position
        rules alone judged every model before issue 55; the file rules' figures are one model's, and on
        another they could leave honest files unpaid)."""
        return replace(self, mean=math.inf, spread=0.0, offset=math.inf, offset_spread=0.0)

    @classmethod
    def from_record(cls, figures: Mapping[str, float] | None) -> ForwardLimits:
        """The limits a calibration record states (`Limits.forward`), or the tiny model's where it
        states none (the plug-in then never slashes on them: `file_judge.PipelineJudge._measured`)."""
        if not figures:
            return TINY_FORWARD
        return cls(**{k: float(v) for k, v in figures.items() if k in cls.__dataclass_fields__})


# Measured on the shipped tiny model and stated in its record (workloads/inference/judge/calibrations/
# tiny.json, `pipeline`). Per position (bench/pipeline_forward.py, 253 stage-batches): the worst honest
# position 0.0085; `position` 0.05 (×5.9), `worst` 0.25 (×29), `share` 2 % (no honest position is out).
# Over the file (bench/pipeline_tolerance.py, 99 honest stage-batches of 11 shapes, 1×1 to 64×32, 3
# seeds): the largest honest mean 0.00213 (1 row × 48 tokens), offset 0.00015 over 256 positions or
# more (0.0005 below), offset × √n about 0.003; `mean` 0.0043 (×2), `offset` 0.0003 (×2), `spread` and
# `offset_spread` 0.017 (×2 the worst honest position, which bounds offset × √n too).
TINY_FORWARD = ForwardLimits(position=0.05, share=0.02, worst=0.25, mean=0.0043, spread=0.017, offset=0.0003,
                             offset_spread=0.017)  # fmt: skip


@dataclass(frozen=True)
class ForwardFigures:
    """One stage-batch's comparison: what the rules read."""

    positions: int = 0
    worst: float = 0.0  # the largest per-position error
    share: float = 0.0  # the share of positions above `ForwardLimits.position`
    mean: float = 0.0  # the mean per-position error
    offset: float = 0.0  # the norm of the mean per-position difference (relative to each position's norm)


@dataclass(frozen=True)
class Differences:
    """Per real position of a stage-batch, what was sent against the replay: ‖sent − replay‖/‖replay‖
    (`errors`, [n]) and the sum of (sent − replay)/‖replay‖ (`total`, [H]: what adds up in one
    direction; a sum, so that files pool by adding)."""

    errors: torch.Tensor
    total: torch.Tensor

    @classmethod
    def of(cls, sent: torch.Tensor, replay: torch.Tensor, mask: torch.Tensor) -> Differences:
        """`sent` and `replay` [B, T, H], `mask` [B, T] (1: a real position); float32 over H."""
        real = mask.bool()
        diff = (sent.float() - replay.float())[real]
        scale = replay.float()[real].norm(dim=-1, keepdim=True).clamp_min(1e-6)
        relative = diff / scale
        return cls(relative.norm(dim=-1), relative.sum(dim=0))

    def figures(self, limits: ForwardLimits) -> ForwardFigures:
        n = int(self.errors.numel())
        if not n:
            return ForwardFigures()
        e = self.errors
        return ForwardFigures(n, float(e.max()), float((e > limits.position).float().mean()), float(e.mean()),
                              float(self.total.norm()) / n)  # fmt: skip


def forward_verdict(found: Differences, limits: ForwardLimits) -> tuple[bool, str, ForwardFigures]:
    """(guilty, why, figures): a stage before the last against its replay, per position and over the
    file. `why` names every rule it failed, with the figure and the limit."""
    f = found.figures(limits)
    n, broken = f.positions, []
    if f.share > limits.share:
        broken.append(f"{f.share:.1%} of positions off by over {limits.position} (limit {limits.share:.0%})")
    if f.worst > limits.worst:
        broken.append(f"worst position {f.worst:.3f} (limit {limits.worst})")
    if n and f.mean > limits.mean_limit(n):
        broken.append(f"mean error over its {n} positions {f.mean:.4f} (limit {limits.mean_limit(n):.4f} = "
                      f"{limits.mean} + {limits.spread}/√{n})")  # fmt: skip
    if n and f.offset > limits.offset_limit(n):
        broken.append(f"offset over its {n} positions {f.offset:.4f}, its differences adding up in one "
                      f"direction (limit {limits.offset_limit(n):.4f} = {limits.offset} + "
                      f"{limits.offset_spread}/√{n})")  # fmt: skip
    if not broken:
        return False, "", f
    return True, "what it sent is not what its layers make of what it received: " + "; ".join(broken), f
