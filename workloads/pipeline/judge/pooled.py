"""Pooled per-stage statistics: what one small group file cannot show, a member's recent files can.

A member that runs slightly perturbed weights (N(0, 1e-2) on one matrix) after stage 0 stays inside
the per-chunk TOPLOC envelope of one 8-row file of the tiny model; the mean mantissa error of its
stage's proofs against the replay does not: honest stages sit near 0.05 (before the last) and 0.3
(the last, final-norm output at decode positions), perturbed ones near 0.5 and 0.6-1.0
(bench/pipeline_pooled.py). One file has too few chunks for that mean to mean much; a window of the
member's recent files has enough.

**The window.** For each member (node address) the validator keeps, through `NodeWindows`, one entry
per batch it judged of that member: the group (its members in stage order), the member's stage, the
batch's content key, and every stage's chunk count and sum of chunk mantissa-error means. Pooling adds
the sums of the entries of *the same group and stage* (deduplicated by batch: a restarted validator
that judges a batch again does not count it twice) and divides.

**Who feeds it.** A member's window is fed only when that member's own file is judged, the file
passed every other check (task rules, identity: the submitter is the member the file names at its
stage, never-paid rows) and the batch was accepted chunk by chunk. So a neighbour cannot write into
an honest member's window: it cannot submit as that member, and the stage statistics in the member's
own file are of the proofs the member checked were its own before writing the file (`member.py`). A
batch rejected chunk by chunk (someone blamed, or an earlier stage visibly off) is left out: its
deviations are already judged, and pooling them would let a neighbour's visible lie weigh on the
honest member after it.

**The rule (`pooled_blame`)**, the per-batch rule in pooled form: a stage is *out* when its pooled mean
is above its limit (`inner_mean` before the last, `last_mean` at the last) over at least `min_chunks`
chunks; the first stage out is blamed, provided no stage before it *explains* it: an earlier stage
explains stage k when `amplification` times its excess (pooled mean over the honest base of its
position) reaches stage k's excess, or when it has too few chunks to say. Then nobody is blamed and
the batch is not paid.

Why the blame lands on the right member: stage k's proofs are compared with the replay of stage k from
the *recomputed* (honest) output of stage k-1, so stage k's deviation is the sum of its own and of
whatever its predecessors' lies did to its input. Entries pooled for one member all come from the same
group, so every batch in the window ran through the same predecessors, and their pooled deviations are
measured over the same batches. A predecessor that lied enough to push stage k over its limit shows
its own excess over the same window: perturbed weights at stage 1 of 3 raise stage 1's pooled mean by
about 0.4 and the last stage's by about 0.7; at most ×1.82 of an earlier excess was measured at a
later stage. So a stage whose excess is more than `amplification` (4) times every earlier one's did not only
amplify: its own layers added it. When an earlier stage could explain it, nobody is blamed rather
than the member that may only have amplified a neighbour's lie (and stage k is the first out, so the
earlier ones are within their limits: none of them can be blamed either).
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
    inner_mean: float  # a stage before the last with a pooled mean above this is out
    last_mean: float  # the last stage is out above this
    base_inner: float  # an honest stage before the last, typically (its *excess* is measured from here)
    base_last: float  # an honest last stage, typically
    amplification: float  # how much of an earlier stage's excess a later stage may show, at most
    min_chunks: int  # fewer pooled chunks than this: the stage is not judged yet


# Measured on the shipped tiny model (bench/pipeline_pooled.py, bench/out/pipeline_pooled.json: 2,120
# honest rows of 2- and 3-member groups, windows of files of one shape, 1x1 to 64x1 and 8x96, and
# mixed): honest pooled means reach 0.098 before the last stage and 0.354 at the last; perturbed-weights
# members reach at least 0.358 (middle of 3), 1.355 (stage 0) and 0.561 (last) at their own stage.
# `inner_mean` 0.3: ×3.1 the worst honest, ×0.84 the weakest cheater; `last_mean` 0.45: ×1.27 the
# worst honest, ×0.80 the weakest cheater. A later stage showed at most ×1.82 of an earlier member's
# excess (over the bases, the typical honest means: 0.03-0.09 before the last, 0.1-0.31 at the last):
# `amplification` 4 (×2.2). `min_chunks` 16: a window of 1-chunk files is judged from its 16th file.
# A deeper or wider model is calibrated again before its pool pays.
TINY_POOLED = PooledLimits(inner_mean=0.3, last_mean=0.45, base_inner=0.05, base_last=0.25,
                           amplification=4.0, min_chunks=16)  # fmt: skip


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
        limit = limits.last_mean if k == last else limits.inner_mean
        value = pooled_mean(stats)
        if stats.chunks < limits.min_chunks or value <= limit:
            continue
        what = (f"pooled: stage {k}'s mean mantissa error {value:.3f} over the last {files} files of this "
                f"group ({stats.chunks} chunks) is above the limit {limit}")  # fmt: skip
        own = excess(stats, base(k))
        explains = [j for j in range(k) if pooled[j].chunks < limits.min_chunks
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
    limit = limits.last_mean if last else limits.inner_mean
    value = pooled_mean(stats)
    if stats.chunks < limits.min_chunks or value <= limit:
        return PooledVerdict()
    return PooledVerdict(stage, True, [
        f"pooled: stage {stage}'s mean mantissa error {value:.3f} against the replay of what it received, "
        f"over its last {files} files of this group ({stats.chunks} chunks), is above the limit {limit}: "
        "not the claimed weights"])  # fmt: skip
