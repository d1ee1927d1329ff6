"""A member judges its own file before it writes it: it never holds a file its own judge would fail.

`inbound.py` checks every field of every frame a member receives. What no rule there foresaw is caught
here, by construction: at the end of a batch, with the bundle and its link records in hand, the member
runs the validator's own rule on itself (`judge.replay.judge_member`: its link records, its frames against
them, every sealed frame against the batch, its stage replayed from what it received and compared with
what it sent) on its own layers, at a margin inside the judge's limits (`SelfLimits`). A batch its judge
would find it guilty of is dropped, naming the member that fed it: the input is the only thing an
honest member's verdict depends on that it did not make. The group stops, nothing is written, nobody
is paid or judged.

The margin: the validator replays on another machine, whose kernels round differently. The figures the
limits judge are an honest decode against a prefill (bench/pipeline_forward.py: worst honest position
0.0085 against a limit of 0.05); a second prefill on another machine moves them by far less than the
20 % kept here, so a file that passes here passes there. The own-stage pooled rule (`judge/pooled.py`) is
held the same way over the member's own window of files: it refuses a batch that would put its own
pooled mean past 80 % of the validator's limit for its stage position (`PooledLimits.own_limit`: the
figures `pooled_own` blames on; honest ones stay under 60 % of it, bench/pipeline_pooled.py).

Cost: one prefill of the member's own layers over the batch (what the validator runs for this file):
5-11 % of a member's batch time on this CPU machine (bench/pipeline_selfcheck.py, docs/pipeline.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from workloads.model.sampler import ReplayLimits
from workloads.pipeline.bundle import GroupBundle
from workloads.pipeline.judge.end_to_end import GroupThresholds, StageStats
from workloads.pipeline.judge.pooled import TINY_POOLED, PooledLimits, pooled_mean
from workloads.pipeline.judge.replay import TINY_FORWARD, ForwardLimits, judge_member
from workloads.pipeline.stages import Stage, StagePlan
from workloads.pipeline.transport import MemberMisbehaved
from workloads.toploc import ToplocThresholds

MARGIN = 0.8  # a member holds itself to 80 % of every per-file limit the validator applies...
# ...and of its own pooled limit: honest own figures of the tiny model reach 0.267 in one file of 0.45
# (the last of 2, on a policy trained far from the base), 0.137 of 0.3 (stage 0), 0.055 of 0.2 (the last
# of 3): each at most 0.59 of its limit, under this margin's 0.8.
POOLED_MARGIN = 0.8
WINDOW = 64  # files a member's own pooled figures run over (`judge.pooled.POOL_FILES`)


def _tighter(limits: Any, factor: float) -> Any:
    """Every float limit of a frozen dataclass times `factor` (a smaller figure is stricter)."""
    return replace(limits, **{f.name: getattr(limits, f.name) * factor for f in fields(limits)
                              if isinstance(getattr(limits, f.name), float)})  # fmt: skip


@dataclass(frozen=True)
class SelfLimits:
    """The validator's limits for the model, held at `MARGIN`."""

    forward: ForwardLimits = TINY_FORWARD
    group: GroupThresholds = field(default_factory=GroupThresholds)
    pooled: PooledLimits = TINY_POOLED
    # False: the model has no record calibrating the pipeline workload, so the validator never slashes on
    # a measured limit there (`judge.file_judge.PipelineJudge._measured`): only the exact rules (its own
    # signed frames, every sealed field) can cost stake, and only those stop a batch here.
    measured: bool = True

    def held(self) -> tuple[ForwardLimits, GroupThresholds]:
        """(forward, last stage's) limits at the margin."""
        chunk = self.group.chunk
        tight_chunk = ToplocThresholds(
            max_exp_mismatches=max(0, chunk.max_exp_mismatches - 2), max_mant_err_mean=chunk.max_mant_err_mean
            * MARGIN, max_mant_err_median=max(0.0, chunk.max_mant_err_median - 1))  # fmt: skip
        replay = ReplayLimits(near_tie=self.group.replay.near_tie, cap=self.group.replay.cap * MARGIN,
                              per_row=self.group.replay.per_row)  # fmt: skip
        group = replace(self.group, chunk=tight_chunk, replay=replay)
        return _tighter(self.forward, MARGIN), group

    def pooled_limit(self, stage: int, last: bool) -> float:
        """The own pooled limit of the member's stage position (`pooled_own`'s) at the margin."""
        return self.pooled.own_limit(stage, last) * POOLED_MARGIN


def limits_for(model: str | None) -> SelfLimits:
    """What a member of a group running `model` holds itself to: the validator's limits for that model
    (`calibration.resolve_limits`, the one place every judge gets them), measured rules only where a
    record calibrates the pipeline workload on it."""
    from workloads.inference.judge.calibration import resolve_limits

    limits = resolve_limits(model)
    if not limits.calibrated("pipeline"):
        return SelfLimits(forward=TINY_FORWARD.per_position(), measured=False)
    return SelfLimits(forward=ForwardLimits.from_record(limits.forward))


class SelfCheck:
    """One member's judge of itself, with its own window of files for the pooled rule."""

    def __init__(self, limits: SelfLimits | None = None) -> None:
        self.limits = limits or SelfLimits()
        self.window: list[StageStats] = []

    def check(self, stage: Stage, bundle: GroupBundle, received: list[list[bytes]], sent: list[list[bytes]],
              *, task_id: str, group_id: str, batch: int, eos: int, pad: int, prev: int) -> None:  # fmt: skip
        """Raise `MemberMisbehaved` naming `prev` when this member's file of the batch would fail."""
        plan = stage.plan
        local = StagePlan(plan.index, plan.members, range(len(plan.layers)))  # its layers, held alone
        forward, group = self.limits.held()
        verdict = judge_member(stage.model, [local] * plan.members, plan.index, bundle, received, sent,
                               task_id=task_id, group_id=group_id, batch=batch, eos=eos, pad=pad,
                               limits=forward, thresholds=group)  # fmt: skip
        if verdict.guilty and (verdict.exact or self.limits.measured):
            raise MemberMisbehaved(prev, "what it sent would make this member's file fail its judge: "
                                         f"{verdict.reasons[0]}")  # fmt: skip
        if not verdict.proven or not verdict.stats.chunks or not self.limits.measured:
            return
        pooled = StageStats(sum(s.chunks for s in self.window) + verdict.stats.chunks,
                            sum(s.mant_sum for s in self.window) + verdict.stats.mant_sum)  # fmt: skip
        limit = self.limits.pooled_limit(plan.index, plan.last)
        if pooled.chunks >= self.limits.pooled.min_chunks and pooled_mean(pooled) > limit:
            raise MemberMisbehaved(prev, f"what it sent would put this member's own pooled mantissa error at "
                                         f"{pooled_mean(pooled):.3f}, past {limit:.3f}")  # fmt: skip
        self.window = [*self.window, verdict.stats][-WINDOW:]
