"""Measuring a model's forward tolerance (`judge/tolerance.py`): the `pipeline` part of its
calibration record.

The replay's limits depend on the model as TOPLOC's do (issue 43): bf16 rounding of a decode step
against a prefill compounds over a stage's depth and width. So a model's limits come from honest groups
*of that model*: thread groups (`group.run_thread_group`: the real member protocol, signed links) of 2
and 3 members over batch shapes from one row of one token to 64 rows, each forwarding stage's
per-position errors against the replay of what it received. From them (`derive_forward`):

- `position` = worst honest position × `POSITION_MARGIN`, `worst` = `position` × `WORST_FACTOR`
  (the tiny model's 0.05 and 0.25 came from ×5.9 and ×29), `share` as shipped (2 %);
- over the file (`MARGIN` each): `mean` = the largest honest file mean, `spread` = the worst honest
  position; `offset` = the largest honest offset of a file of `LARGE` positions or more, and
  `offset_spread` = the largest honest offset × √n (at least the worst honest position).

Then every honest stage-batch is judged again under those limits with the judge itself
(`judge.replay.judge_member`; any guilty one makes the record unusable, as the inference calibration's false
positives do), and the compute-saving cheats (`cheats.py`: int8, fp16, bias, half-bias, skip-layer)
at every forwarding stage are graded: caught by one file, by a window of the member's files (the
pooled own-stage rule, `judge.pooled.pooled_own`, or the mean rule over the pooled positions), or not at all.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from workloads.pipeline.bundle import BatchRequest
from workloads.pipeline.group import run_thread_group
from workloads.pipeline.judge.end_to_end import StageStats
from workloads.pipeline.judge.pooled import pooled_own
from workloads.pipeline.judge.replay import activations, fed_ids, judge_member, mask_positions, run_layers
from workloads.pipeline.judge.tolerance import LARGE, TINY_FORWARD, Differences, ForwardLimits
from workloads.pipeline.member import StageOutput
from workloads.pipeline.selfcheck import SelfLimits
from workloads.pipeline.stages import StagePlan, plan_stages

POSITION_MARGIN, WORST_FACTOR, MARGIN = 6.0, 5.0, 2.0
Shapes = tuple[tuple[int, int], ...]
SHAPES: Shapes = ((1, 1), (1, 8), (1, 48), (8, 1), (8, 24), (16, 48), (64, 8))  # (rows, output tokens)
QUICK_SHAPES: Shapes = ((1, 1), (1, 48), (8, 24), (64, 8))
COMPUTE_CHEATS = ("int8", "fp16", "bias", "half-bias", "skip-layer")
WORDS = ("abc", "hello", "pipeline", "stage", "group", "verify", "token", "proof", "a", "reverse me please",
         "zz", "longer prompt words here")  # fmt: skip


@dataclass
class Sample:
    """One forwarding stage's comparison in one batch of one group."""

    members: int
    stage: int
    cheat: str  # "none": honest
    rows: int
    tokens: int
    seed: int
    found: Differences  # per real position, and summed
    output: StageOutput = field(repr=False)
    stats: StageStats = field(default_factory=StageStats)  # its proofs against the replay (once judged)

    @property
    def positions(self) -> int:
        return int(self.found.errors.numel())


def request(tokenizer: Any, rows: int, tokens: int, seed: int) -> BatchRequest:
    prompts = [tokenizer(f"reverse: {WORDS[(seed + i) % len(WORDS)]}")["input_ids"] for i in range(rows)]
    return BatchRequest(prompts, [seed * 1000 + i for i in range(rows)], tokens, 1.0)


def stage_differences(model: PreTrainedModel, plans: list[StagePlan], stage: int, out: StageOutput,
                      eos: int, pad: int) -> Differences:  # fmt: skip
    """A forwarding stage against the replay of what it received, as `judge_member` compares them
    (without the evidence checks: these are our own groups)."""
    b, plan = out.bundle, plans[stage]
    assert b is not None
    rows, steps = len(b.prompts), max(map(len, b.outputs))
    sent = activations(out.sent_frames, stage, rows)
    width = int(sent.shape[1]) - (steps - 1)
    mask, pos = mask_positions([len(p) for p in b.prompts], width, steps - 1)
    if plan.first:
        x = fed_ids(b, width, steps - 1, eos, pad)
    else:
        x = activations(out.received_frames, stage - 1, rows)
    return Differences.of(sent, run_layers(model, plan, x, mask, pos), mask)


def run_samples(name: str, model: PreTrainedModel, tokenizer: Any, cheat: str, shapes: Shapes,
                seeds: tuple[int, ...], progress: Callable[[str], None]) -> list[Sample]:  # fmt: skip
    """Groups of 2 and 3 members of model `name` over every shape and seed; `cheat` at each forwarding
    stage in turn ("none": honest groups, every forwarding stage sampled)."""
    eos, pad = int(tokenizer.eos_token_id), int(tokenizer.pad_token_id or 0)
    samples = []
    for members in (2, 3):
        plans = plan_stages(name, members)
        for cheater in [None] if cheat == "none" else range(members - 1):
            where = "" if cheater is None else f" at stage {cheater}"
            progress(f"pipeline: {cheat} in groups of {members}{where}")
            for rows, tokens in shapes:
                for seed in seeds:
                    cheats = None if cheater is None else {cheater: cheat}
                    # Its limits are what is being measured: honest members hold themselves to the exact
                    # rules alone meanwhile (what a member sends does not depend on its self-check).
                    run = run_thread_group(members, request(tokenizer, rows, tokens, seed), model=name,
                                           cheats=cheats, self_limits=SelfLimits(measured=False))  # fmt: skip
                    if not run.ok:
                        raise RuntimeError(f"a {members}-member group of {name} failed: {run.errors}")
                    for k in range(members - 1) if cheater is None else [cheater]:
                        found = stage_differences(model, plans, k, run.outputs[k], eos, pad)
                        samples.append(Sample(members, k, cheat, rows, tokens, seed, found, run.outputs[k]))
    return samples


def _up(value: float, digits: int = 2) -> float:
    """`value` rounded up to `digits` significant digits (a limit never below what it was derived from)."""
    if value <= 0:
        return 0.0
    scale = 10 ** (digits - 1 - math.floor(math.log10(value)))
    return math.ceil(value * scale) / scale


def derive_forward(honest: list[Sample]) -> ForwardLimits:
    """The limits from honest stage-batches (module doc): each at the largest honest figure × its margin."""
    figures = [(s.positions, s.found.figures(TINY_FORWARD)) for s in honest if s.positions]
    worst = max(f.worst for _, f in figures)
    mean = max(f.mean for _, f in figures)
    offset = max([f.offset for n, f in figures if n >= LARGE], default=0.0)
    drift = max([worst, *(f.offset * math.sqrt(n) for n, f in figures)])
    position = _up(worst * POSITION_MARGIN)
    return ForwardLimits(position=position, share=TINY_FORWARD.share, worst=_up(position * WORST_FACTOR),
                         mean=_up(mean * MARGIN), spread=_up(worst * MARGIN), offset=_up(offset * MARGIN),
                         offset_spread=_up(drift * MARGIN))  # fmt: skip


def judged(model: PreTrainedModel, name: str, tokenizer: Any, s: Sample,
           limits: ForwardLimits) -> tuple[bool, StageStats]:  # fmt: skip
    """The judge's own verdict on a sample (`judge.replay.judge_member`, as the plug-in calls it): guilty, and
    its proofs' statistics against the replay (what the pooled window adds up)."""
    out = s.output
    assert out.bundle is not None
    v = judge_member(model, plan_stages(name, s.members), s.stage, out.bundle, out.received_frames,
                     out.sent_frames, task_id="local", group_id="local", batch=1, limits=limits,
                     eos=int(tokenizer.eos_token_id), pad=int(tokenizer.pad_token_id or 0))  # fmt: skip
    return v.guilty, v.stats


def closest(found: Differences, limits: ForwardLimits) -> float:
    """How near a stage-batch comes to being caught over the file: the larger of its mean and offset,
    each over its limit at its size (above 1: caught)."""
    f = found.figures(limits)
    if not f.positions:
        return 0.0
    return max(f.mean / limits.mean_limit(f.positions), f.offset / limits.offset_limit(f.positions))


def grade(model: PreTrainedModel, name: str, tokenizer: Any, samples: list[Sample],
          limits: ForwardLimits) -> dict[str, Any]:  # fmt: skip
    """One cheat's (or the honest) stage-batches under `limits`, judged by `judge_member`: files caught
    (and the largest file missed), the file nearest the other side of the file rules (honest: the
    highest figure / limit; a cheat: the lowest), and each member's window (its files pooled)."""
    caught, missed, near = 0, 0, []
    for s in samples:
        guilty, s.stats = judged(model, name, tokenizer, s, limits)
        caught += guilty
        missed = max(missed, 0 if guilty else s.positions)
        near.append(closest(s.found, limits))
    where = sorted({(s.members, s.stage) for s in samples})
    windows = [_window([s for s in samples if (s.members, s.stage) == w], limits) for w in where]
    edge = max if samples[0].cheat == "none" else min  # the side a verdict could flip from
    return {"files": len(samples), "caught": caught, "largest_file_missed": missed,
            "file_over_limit": round(edge(near), 3),
            "window_over_limit": round(edge(w[0] for w in windows), 3),
            "window_caught": sum(w[1] for w in windows), "windows": len(windows),
            "worst_position": round(max(float(s.found.errors.max()) for s in samples if s.positions), 5),
            "largest_mean": round(max(float(s.found.errors.mean()) for s in samples if s.positions), 5),
            "largest_offset": round(max(s.found.figures(limits).offset for s in samples), 5)}  # fmt: skip


def _window(mine: list[Sample], limits: ForwardLimits) -> tuple[float, bool]:
    """A member's window: its files at one stage position pooled (their positions under the file rules,
    and their proofs under the pooled own-stage TOPLOC rule, `judge.pooled.pooled_own`): (figure / limit,
    caught)."""
    pooled = Differences(torch.cat([s.found.errors for s in mine]), sum((s.found.total for s in mine),
                                                                       torch.zeros_like(mine[0].found.total)))
    stats = StageStats(sum(s.stats.chunks for s in mine), sum(s.stats.mant_sum for s in mine))
    over = closest(pooled, limits)
    return over, over > 1 or pooled_own(stats, mine[0].stage, False, len(mine)).out


def measure_forward(name: str, model: PreTrainedModel, tokenizer: Any, *, quick: bool = False,
                    progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:  # fmt: skip
    """The `pipeline` part of model `name`'s record: its derived limits and what they rest on."""
    started = time.time()
    shapes, seeds = (QUICK_SHAPES, (1,)) if quick else (SHAPES, (1, 2))
    honest = run_samples(name, model, tokenizer, "none", shapes, seeds, progress)
    limits = derive_forward(honest)
    progress("pipeline: judging every honest stage-batch again under the derived limits")
    measured: dict[str, Any] = {"honest": grade(model, name, tokenizer, honest, limits)}
    for cheat in COMPUTE_CHEATS:
        samples = run_samples(name, model, tokenizer, cheat, shapes, seeds[:1], progress)
        measured[cheat] = grade(model, name, tokenizer, samples, limits)
    margins = {"position": POSITION_MARGIN, "worst": POSITION_MARGIN * WORST_FACTOR, "mean": MARGIN,
               "spread": MARGIN, "offset": MARGIN, "offset_spread": MARGIN}  # fmt: skip
    return {"limits": limits.figures(), "margins_over_largest_honest": margins,
            "shapes": [list(s) for s in shapes], "seeds": list(seeds), "measured": measured,
            "seconds": round(time.time() - started, 1)}  # fmt: skip
