"""Pooled per-stage statistics: what one small group file cannot show, a member's recent files can.

A member that runs slightly perturbed weights (N(0, 1e-2) on one matrix) after stage 0 stays inside
the per-chunk TOPLOC envelope of one file of the tiny model; the mean mantissa error of its stage's
proofs against the replay does not (bench/pipeline_pooled.py). One file has too few chunks for that
mean to mean much; a window of the member's recent files has enough.

**Two figures, two rules.** Each judged batch gives every stage's proofs against one prefill of the
whole model (*end to end*: `end_to_end.judge_group`), and the member's *own* stage against the replay of
what it received (`replay.judge_member`).

- *Blame* (`pooled_own`): a member whose own pooled mean, over at least `min_chunks` chunks, is above
  its position's limit (`PooledLimits.own_limit`) is out and blamed. No earlier member's lie is in those
  figures, so none can explain them. Honest own figures are small and stay small on a trained policy:
  the replay starts from exactly what the member received.
- *Pay* (`pooled_blame`): the end-to-end figures pooled, over at least `pay_chunks` chunks; a stage out
  (`pay_inner`, `pay_last`) leaves the batch unpaid and blames nobody (an earlier member's invisible
  change can be in them). The last stage's end-to-end figure holds the whole model's decode-against-
  prefill rounding, and that grows with how far the policy has moved from the base model: the same
  shape's honest last stage pools at 0.43 on the base model and at 0.68 on a policy trained far from it
  (one 16-chunk file: 0.98), while a perturbed last stage of 3 pools from 0.56. No end-to-end limit
  separates them on every checkpoint, so `pay_last` sits above every honest figure measured and the
  own-figures rule is what catches the last stage.

**The window.** For each member (node address) the validator keeps, through `NodeWindows`, one entry
per batch it judged of that member: the group (its members in stage order), the member's stage, the
batch's content key, every stage's chunk count and sum of chunk mantissa-error means, and the member's
own. Pooling adds the sums of the entries of *the same group and stage* (deduplicated by batch: a
restarted validator that judges a batch again does not count it twice) and divides.

**Who feeds it.** A member's window is fed only when that member's own file is judged, the file
passed every other check (task rules, identity: the submitter is the member the file names at its
stage, never-paid rows) and the batch was accepted chunk by chunk. So a neighbour cannot write into
an honest member's window: it cannot submit as that member, and the stage statistics in the member's
own file are of the proofs the member checked were its own before writing the file (`member.py`). A
batch rejected chunk by chunk (someone blamed, or an earlier stage visibly off) is left out: its
deviations are already judged, and pooling them would let a neighbour's visible lie weigh on the
honest member after it.

**The end-to-end rule (`pooled_blame`)**, the per-batch rule in pooled form: a stage is *out* when its
pooled mean is above its limit (`pay_inner` before the last, `pay_last` at the last) over at least
`pay_chunks` chunks; the first stage out is named, provided no stage before it *explains* it: an
earlier stage explains stage k when `amplification` times its excess (pooled mean over the honest base
of its position) reaches stage k's excess, or when it has too few chunks to say. Either way the batch
is not paid; the validator blames on the own figures only (`file_judge.PipelineJudge._pooled_verdict`).

Why stage k's end-to-end figure holds its predecessors' lies: its proofs are compared with the replay
of stage k from the *recomputed* (honest) output of stage k-1, so its deviation is the sum of its own
and of whatever its predecessors' lies did to its input. Entries pooled for one member all come from
the same group, so every batch in the window ran through the same predecessors, and their pooled
deviations are measured over the same batches: perturbed weights at stage 1 of 3 raise stage 1's
pooled mean by about 0.3 and the last stage's by more; at most ×1.9 of an earlier excess was measured
at a later stage on the base model, ×4.9 on a policy trained far from it (whose honest last stage is
itself far above the base's `base_last`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from workloads.pipeline.judge.end_to_end import StageStats

KIND = "pipeline-stage"  # marks this plug-in's entries in a node's window, shared with other workloads
POOL_FILES = 64  # entries kept per member (its recent files, any group)


@dataclass(frozen=True)
class PooledLimits:
    # A member's own stage against the replay of what it received (`pooled_own`: blame; and the member's
    # check of itself before it writes its file, `selfcheck.py`):
    inner_mean: float  # a stage before the last with an own pooled mean above this is out: blamed
    last_mean: float  # the last stage's own limit, where `last_of` does not name its group's size
    min_chunks: int  # fewer pooled chunks than this: a member's own figures are not judged yet
    # Every stage end to end, against one prefill of the whole model (`pooled_blame`: pay only):
    pay_inner: float  # a stage before the last with a pooled mean above this is out: the batch is not paid
    pay_last: float  # the last stage is out above this
    pay_chunks: int  # fewer pooled chunks than this: the batch's end-to-end figures are not judged yet
    base_inner: float  # an honest stage before the last, typically (its *excess* is measured from here)
    base_last: float  # an honest last stage, typically
    amplification: float  # how much of an earlier stage's excess a later stage may show, at most
    # (members, own limit) of the last stage of groups of that size, where the model's split makes that
    # stage unlike the others (the tiny model's last of 3 holds one layer, its last of 2 two)
    last_of: tuple[tuple[int, float], ...] = ()

    def own_limit(self, stage: int, last: bool) -> float:
        """The own-figures limit of stage `stage` (the last stage's index is its group's size less one)."""
        return dict(self.last_of).get(stage + 1, self.last_mean) if last else self.inner_mean


# Measured on the shipped tiny model (bench/pipeline_pooled.py; bench/out/pipeline_pooled*.json), windows
# of one shape each and mixed, 2- and 3-member groups, every window judged from `min_chunks`
# (`pay_chunks` end to end): (a) the base model over 1x1 to 64x1 and 8x96 rows x tokens of `demo`
# prompts (2,120 honest rows); (b) an RL run's batches, 16x16 and 64x16 (4 or 16 prompts x 4 completions
# of `reverse`, rows stopping at their end token: the devnet's pipeline task, whose first file of the
# group of 2 pooled 0.453 end to end at the last stage, over the 0.45 these limits held before), on the
# base model, on the fire run's trainer checkpoint of step 4 (KL 0.17 to the base) and on a policy 16
# synthetic GRPO steps away (`--weights synthetic:16`, KL 12-44: the drifted end); 4,608 honest rows.
# Honest worst pooled mean (a window; one file of at least 16 chunks) / the weakest perturbed-weights
# cheater's at its own stage, over all of them:
#
#   own figures (blame)   first stage    middle of 3    last of 2       last of 3
#   honest window / file  0.115 / 0.137  0.026 / 0.030  0.198 / 0.267   0.029 / 0.055
#   weakest cheater       1.15           0.337          0.778           0.378 (one file: 0.353)
#   limit                 0.3            0.3            0.45            0.2
#
#   end to end (pay)      before the last          last stage
#   honest window         0.168 (drifted: 0.162)   0.428 (base, step 4) / 0.679 (drifted)
#   weakest cheater       0.375 (middle of 3)      0.556 (last of 3) / 0.871 (last of 2)
#   limit                 0.3                      1.0
#
# Own limits: `inner_mean` 0.3 is ×2.6 the worst honest window (×2.2 the worst file) and ×0.89 the
# weakest cheater (the middle stage, whose forwarded values also fail the file rules: in every file at
# the RL shapes); `last_mean` 0.45 (the last of 2) is ×2.3 the worst honest window and ×1.7 the worst
# file (both on the drifted policy; ×3.4 the base's and step 4's windows) and ×0.58 the weakest cheater;
# `last_of` 3: 0.2 is ×6.9 the worst honest window, ×3.7 the worst file and ×0.53 the weakest cheater
# (×0.57 its weakest file). One own limit for both last stages would have a margin of neither: the
# honest last of 2 on the drifted policy (0.267 in one file) and the perturbed last of 3 (0.353 in one
# file) are too close.
# Pay limits: the honest last stage end to end grows with the policy's drift, and the weakest cheater at
# the last of 3 lies below the drifted honest figure: no end-to-end limit separates them on every
# checkpoint. So `pay_last` 1.0 stands on the honest side, ×1.47 the worst honest (drifted) window, ×1.31
# its worst 64-chunk file, ×2.3 the base's and step 4's windows, and the last stage's cheats are caught
# by the own limits instead: 75 of 75 cheating sequences blamed exactly the cheater (at the RL shapes from
# the first file whose own figures reach 16 chunks, within 3 files of 8 rows, from the 16th of 1-chunk
# files), no honest member blamed or left unpaid. `pay_inner` 0.3: ×1.79 the worst honest window, ×0.8
# the weakest cheater. `pay_chunks` 64: one honest 16-chunk file reached 0.98 at the last stage end to
# end (drifted), 64-chunk files 0.76. `min_chunks` 16: a window of 1-chunk files is judged from its 16th
# file. `amplification` 6: ×1.2 the ×4.9 measured on the drifted policy (×1.9 on the base model). The
# same seeds and shapes of (a) measure higher than when these limits were first set (the last of 2 end
# to end: 0.42, then 0.342; the middle of 3: 0.168, then 0.098): they are measured again with the code
# that makes them, and a deeper or wider model is calibrated again before its pool pays.
TINY_POOLED = PooledLimits(inner_mean=0.3, last_mean=0.45, min_chunks=16, pay_inner=0.3, pay_last=1.0,
                           pay_chunks=64, base_inner=0.05, base_last=0.25, amplification=6.0,
                           last_of=((3, 0.2),))  # fmt: skip


@dataclass
class PooledVerdict:
    blamed: int | None = None  # the stage whose member is blamed
    out: bool = False  # some stage is out (blamed or not): the batch is not paid
    reasons: list[str] = field(default_factory=list)


def group_key(task_id: str, group_id: str, members: list[str]) -> str:
    """A group as the windows know it: the same members in the same order in the same task's group."""
    text = "\n".join([task_id, group_id, *(m.lower() for m in members)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def window_entry(group: str, stage: int, batch: str, stats: list[StageStats],
                 own: StageStats | None = None) -> dict[str, Any]:  # fmt: skip
    """One judged batch of one member, as JSON for `NodeWindows.push`: every stage's end-to-end figures
    and (`own`) the member's own stage against the replay of what it received."""
    entry = {"kind": KIND, "group": group, "stage": stage, "batch": batch,
             "chunks": [s.chunks for s in stats], "mant": [round(s.mant_sum, 6) for s in stats]}  # fmt: skip
    if own is not None:
        entry["own"] = [own.chunks, round(own.mant_sum, 6)]
    return entry


def pool_own(window: list[dict[str, Any]], group: str, stage: int) -> tuple[StageStats, int]:
    """The member's own-stage figures summed over the window's entries of this group and stage."""
    seen: set[str] = set()
    chunks, mant = 0, 0.0
    for entry in window:
        if entry.get("kind") != KIND or entry.get("group") != group or entry.get("stage") != stage:
            continue
        own = entry.get("own")
        if entry["batch"] in seen or not isinstance(own, list) or len(own) != 2:
            continue
        seen.add(entry["batch"])
        chunks += int(own[0])
        mant += float(own[1])
    return StageStats(chunks, mant), len(seen)


def pool(window: list[dict[str, Any]], group: str, stage: int) -> tuple[list[StageStats], int]:
    """Every stage's statistics summed over the window's entries of this group and stage (each batch
    once), and how many files that is."""
    seen: set[str] = set()
    chunks: list[int] = []
    mant: list[float] = []
    for entry in window:
        if entry.get("kind") != KIND or entry.get("group") != group or entry.get("stage") != stage:
            continue
        if entry["batch"] in seen or (chunks and len(entry["chunks"]) != len(chunks)):
            continue
        seen.add(entry["batch"])
        if not chunks:
            chunks, mant = [0] * len(entry["chunks"]), [0.0] * len(entry["chunks"])
        for i, (c, m) in enumerate(zip(entry["chunks"], entry["mant"], strict=True)):
            chunks[i] += int(c)
            mant[i] += float(m)
    return [StageStats(c, m) for c, m in zip(chunks, mant, strict=True)], len(seen)


def pooled_mean(stats: StageStats) -> float:
    return stats.mant_sum / stats.chunks if stats.chunks else 0.0


def excess(stats: StageStats, base: float) -> float:
    return max(0.0, pooled_mean(stats) - base)


def pooled_blame(pooled: list[StageStats], files: int, limits: PooledLimits = TINY_POOLED) -> PooledVerdict:
    """The first stage out over the window, blamed when no stage before it explains it (see the module
    docstring for why that is its member and not one that amplified an earlier lie)."""
    last = len(pooled) - 1

    def base(k: int) -> float:
        return limits.base_last if k == last else limits.base_inner

    for k, stats in enumerate(pooled):
        limit = limits.pay_last if k == last else limits.pay_inner
        value = pooled_mean(stats)
        if stats.chunks < limits.pay_chunks or value <= limit:
            continue
        what = (f"pooled: stage {k}'s mean mantissa error {value:.3f} over the last {files} files of this "
                f"group ({stats.chunks} chunks) is above the limit {limit}")  # fmt: skip
        own = excess(stats, base(k))
        explains = [j for j in range(k) if pooled[j].chunks < limits.pay_chunks
                    or limits.amplification * excess(pooled[j], base(j)) >= own]  # fmt: skip
        if explains:
            j = explains[0]
            return PooledVerdict(None, True, [
                f"{what}, but stage {j} before it deviates too ({pooled_mean(pooled[j]):.3f} over "
                f"{pooled[j].chunks} chunks; ×{limits.amplification} its excess over {base(j)} reaches "
                f"stage {k}'s, {own:.3f}): not paid, nobody blamed"])  # fmt: skip
        return PooledVerdict(k, True, [f"{what}: not the claimed weights"])
    return PooledVerdict()


def pooled_own(stats: StageStats, stage: int, last: bool, files: int,
               limits: PooledLimits = TINY_POOLED) -> PooledVerdict:  # fmt: skip
    """The rule on a member's *own* stage, pooled from the replays of its stage from what it received
    (`replay.judge_member`): no earlier member's lie is in those figures, so none can explain them and
    the member out is the one blamed. What the validator uses (issue 36); `pooled_blame` is the rule
    on end-to-end figures, where an earlier stage could explain a later one."""
    limit = limits.own_limit(stage, last)
    value = pooled_mean(stats)
    if stats.chunks < limits.min_chunks or value <= limit:
        return PooledVerdict()
    return PooledVerdict(stage, True, [
        f"pooled: stage {stage}'s mean mantissa error {value:.3f} against the replay of what it received, "
        f"over its last {files} files of this group ({stats.chunks} chunks), is above the limit {limit}: "
        "not the claimed weights"])  # fmt: skip
