"""Judging a group's batch end to end: is it right (and so payable)? Who is guilty is not decided here.

One full-model prefill over prompt + output gives, through forward hooks, what every stage should have
sent (`stages.boundary_activations`) and the logits. Accept: every stage's proofs match the recomputed
boundaries (the sign compared too) and every token is the seed's Gumbel draw with its claimed logprob.

When the batch fails, `GroupVerdict.blamed` names the first stage whose proofs are off the *honest*
replay. That is only a hint for the reasons a user reads, never a verdict: a member that forwards
something its proofs do not show (values outside every chunk's top-k) looks clean here while its
honest successor looks far off. Blame is decided by `replay.judge_member`, from what each member
received and sent, committed by both ends of its links (issue 36).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from workloads.model import sampler
from workloads.model.sampler import ReplayLimits
from workloads.pipeline.stages import StagePlan, boundary_activations
from workloads.toploc import ToplocThresholds, verify_proofs_batch
from workloads.toploc.proof import ChunkResult
from workloads.toploc.proof import Verdict as ProofVerdict


@dataclass(frozen=True)
class GroupRows:
    """A group batch as the validator reads it: per row the prompt, the output and its logprobs, the
    seed; per stage, one proof per row."""

    prompts: list[list[int]]
    outputs: list[list[int]]
    logprobs: list[list[float]]
    seeds: list[int]
    stage_proofs: list[list[bytes]]
    temperature: float = 1.0


@dataclass
class GroupVerdict:
    accepted: bool
    blamed: int | None = None  # the first stage off the honest replay: a hint, never a verdict
    reasons: list[str] = field(default_factory=list)
    failed_rows: dict[int, list[int]] = field(default_factory=dict)  # stage → rows whose proofs failed
    stage_stats: list[StageStats] = field(default_factory=list)  # per stage, what the windows pool


@dataclass(frozen=True)
class StageStats:
    """One stage's proofs against the replay, summed over a batch's chunks: sums (not means) so that
    a window of batches pools by adding (`pooled.py`), whatever the batches' sizes."""

    chunks: int = 0
    mant_sum: float = 0.0  # sum over chunks of the chunk's mantissa-error mean
    exp_sum: int = 0  # sum over chunks of the chunk's exponent mismatches
    median_chunks: int = 0  # chunks whose mantissa-error median is >= 1

    @classmethod
    def of(cls, verdicts: list[ProofVerdict]) -> StageStats:
        chunks = [c for v in verdicts for c in v.chunks]
        return cls(len(chunks), float(sum(c.mant_err_mean for c in chunks)),
                   sum(c.exp_mismatches for c in chunks),
                   sum(c.mant_err_median >= 1 for c in chunks))  # fmt: skip


@dataclass(frozen=True)
class Envelope:
    """The most an honest stage's replay differs from its proofs, per chunk (bf16 decode vs prefill)."""

    exp_mismatches: int
    mant_mean: float
    mant_median: float

    def holds(self, chunk: ChunkResult) -> bool:
        return (chunk.exp_mismatches <= self.exp_mismatches and chunk.mant_err_mean <= self.mant_mean
                and chunk.mant_err_median <= self.mant_median)  # fmt: skip


# Measured on the shipped tiny model (bench/pipeline_calibration.py: 2,058 honest rows of 2- and
# 3-member groups, batches of 1 to 64 rows, outputs of 1 to 96 tokens): honest chunks of the stages
# before the last reach exp 5, mean 0.633, median 0. `CLEAN` contains them all (margins +1, ×1.1, +1);
# `INNER`, outside which a stage is blamed, is wider still (+3, ×1.58, +2). The last stage is blamed on
# the per-chunk TOPLOC limits (its honest chunks reach mean 3.6 on 1-token chunks) or on its sampling.
# A deeper or wider model is calibrated again before its pool pays.
TINY_CLEAN = Envelope(exp_mismatches=6, mant_mean=0.7, mant_median=1.0)
TINY_INNER = Envelope(exp_mismatches=8, mant_mean=1.0, mant_median=2.0)


@dataclass(frozen=True)
class GroupThresholds:
    chunk: ToplocThresholds = field(default_factory=lambda: ToplocThresholds(
        max_exp_mismatches=12, max_mant_err_mean=8.0, max_mant_err_median=4.0))  # fmt: skip
    inner: Envelope = TINY_INNER  # a stage before the last outside it is faulty...
    clean: Envelope = TINY_CLEAN  # ...when every stage before it stays inside this
    replay: ReplayLimits = ReplayLimits()
    logprob_tolerance: float = 0.5


@torch.inference_mode()
def judge_group(model: PreTrainedModel, plans: list[StagePlan], rows: GroupRows, pad_token_id: int = 0,
                th: GroupThresholds | None = None) -> GroupVerdict:  # fmt: skip
    """Accept when every stage's proofs pass and the tokens are the seed's draws. Otherwise blame the
    first stage that is out (a stage before the last: outside `inner`; the last: failing the TOPLOC
    limits, or its sampling), provided every stage before it is clean; when an earlier stage is not
    clean (a deviation too small to blame, but there), nobody is blamed: the batch is not paid and
    nobody is slashed, since the one out may only be amplifying an earlier member's small lie."""
    th = th or GroupThresholds()
    n = len(rows.prompts)
    if not (len(rows.outputs) == len(rows.logprobs) == len(rows.seeds) == n):
        reason = "rows: prompts, outputs, logprobs and seeds differ in count"
        return GroupVerdict(False, len(plans) - 1, [reason])
    for i, proofs in enumerate(rows.stage_proofs):
        if len(proofs) != n:
            return GroupVerdict(False, i, [f"stage {i}: {len(proofs)} proofs for {n} rows"])
    seqs = [p + o for p, o in zip(rows.prompts, rows.outputs, strict=True)]
    width = max(map(len, seqs))
    ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)  # right padding: positions before it are unaffected
    with boundary_activations(model, plans) as captured:
        logits = model(input_ids=ids, use_cache=False).logits
    verdicts: list[list[ProofVerdict]] = []
    for stage in plans:
        boundary = captured[stage.index][0]
        hiddens = [boundary[i, len(p) if stage.last else 0 : len(p) + len(o) - 1]
                   for i, (p, o) in enumerate(zip(rows.prompts, rows.outputs, strict=True))]  # fmt: skip
        verdicts.append(verify_proofs_batch(hiddens, rows.stage_proofs[stage.index], th.chunk, signed=True))
    row_logits = [logits[i, len(p) - 1 : len(p) + len(o) - 1]
                  for i, (p, o) in enumerate(zip(rows.prompts, rows.outputs, strict=True))]  # fmt: skip
    faults = token_faults(row_logits, rows.outputs, rows.logprobs, rows.seeds, rows.temperature, th)
    stats = [StageStats.of(v) for v in verdicts]
    if not faults and all(v.passed for stage in verdicts for v in stage):
        return GroupVerdict(True, stage_stats=stats)
    for stage in plans:
        stage_verdicts = verdicts[stage.index]
        if stage.last:
            out = [i for i, v in enumerate(stage_verdicts) if not v.passed]
            what = "its final activations do not match the replay (TOPLOC)"
            if not out and faults:
                out, what = [-1], f"sampling: {faults[0]}"
        else:
            out = [i for i, v in enumerate(stage_verdicts) if not v.passed
                   or not all(th.inner.holds(c) for c in v.chunks)]  # fmt: skip
            what = "what it sent is not what its layers make of its input"
        if not out:
            continue
        unclean = [p.index for p in plans[: stage.index]
                   if not all(th.clean.holds(c) for v in verdicts[p.index] for c in v.chunks)]  # fmt: skip
        if unclean:
            return GroupVerdict(False, None, [
                f"stage {stage.index} is out but stage {unclean[0]} before it deviates too (within "
                "tolerance): not paid, nobody blamed"])  # fmt: skip
        where = f"stage {stage.index} (layers {stage.layers.start}-{stage.layers.stop - 1})"
        rows_text = f"rows {out[:8]}: " if out != [-1] else ""
        return GroupVerdict(False, stage.index, [f"{where}: {rows_text}{what}"], {stage.index: out})
    return GroupVerdict(False, None, ["the group's batch fails, but no stage can be blamed: not paid"])


def token_faults(row_logits: list[torch.Tensor], outputs: list[list[int]], logprobs: list[list[float]],
                 seeds: list[int], temperature: float, th: GroupThresholds) -> list[str]:  # fmt: skip
    """Rows whose tokens are not the seed's Gumbel draws from `row_logits` (per row, the logits each
    of its tokens was drawn from), or whose logprobs are off."""
    faults = []
    for i, (logits, o) in enumerate(zip(row_logits, outputs, strict=True)):
        tokens = torch.tensor(o)
        gaps = sampler.sampling_gaps(logits, tokens, seeds[i], temperature)
        fault = sampler.replay_fault(gaps, th.replay)
        if fault:
            faults.append(f"row {i}: tokens the seed's Gumbel draw does not give ({fault})")
            continue
        lp = sampler.token_logprobs(logits, tokens, temperature)
        err = float((torch.tensor(logprobs[i]) - lp).abs().max())
        if err > th.logprob_tolerance:
            faults.append(f"row {i}: logprobs off the recomputed ones by {err:.2f}")
    return faults
