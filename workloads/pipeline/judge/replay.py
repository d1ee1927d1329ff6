"""Judging one member from its own evidence: replay its stage from what it received, compare with what
it sent (issue 36: blame lands on the guilty member, whatever it forwards).

The end-to-end check (`end_to_end.judge_group`) compares every stage's proofs with one honest full-model
prefill: it says whether the batch is right, but not who made it wrong. A member that forwards
something its layers did not make, and proves what it forwards, passes its own comparison where its
change is outside what a TOPLOC proof covers (a proof holds 128 of a chunk's 4,096 values, and before
`signed` it ignored the sign), while the next member, fed the changed activations, is far off the
honest prefill. Replaying every stage from the *honest* input therefore blames the wrong member.

Here a member is judged only on what its links prove (`commit.py`): its file carries the frames it
received and sent, each direction bound by a record both ends signed. `judge_member`:
1. **evidence**: the records of its incoming and outgoing links are signed by the right members and
   agree (a missing, foreign or disputed record: `proven` False, nobody is blamed); its file's frames
   hash to those records (otherwise its own file contradicts what it signed: guilty);
2. **replay**: its stage's layers run once (a prefill) over exactly the activations it received
   (stage 0: the prompts and the bundle's tokens, which it checked are those it was sent);
3. **compare**: a stage before the last is guilty when what it sent is off the replay by more than
   honest bf16 decode-vs-prefill noise, per position and over the file's positions (`tolerance.py`:
   the *whole* vector, no part of it free; the file's mean error and its offset in one direction, the
   model's limits from its record); the last stage when its proofs fail the TOPLOC limits against the
   replay (signed) or its tokens are not the seed's draws from the replay's logits
   (`end_to_end.token_faults`).
Before the replay, every frame its links' seals cover is held to the batch (`sealed.py`): a lie in
its own sealed metadata is its own, one in what it received is its predecessor's (issue 55).
So an honest member's verdict depends on its own layers and its own frames alone: what a neighbour
forwards to it, or claims to have sent, never makes it guilty.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import PreTrainedModel

from workloads.pipeline.bundle import GroupBundle
from workloads.pipeline.commit import LinkRecord
from workloads.pipeline.judge import sealed
from workloads.pipeline.judge.end_to_end import GroupThresholds, StageStats, token_faults
from workloads.pipeline.judge.tolerance import (  # ForwardLimits, TINY_FORWARD: re-exported here too
    TINY_FORWARD,
    Differences,
    ForwardLimits,
    forward_verdict,
)
from workloads.pipeline.stages import StagePlan
from workloads.pipeline.transport import FILE_HEADER_BYTES, MemberMisbehaved, frames_digest, parse_frame
from workloads.toploc import verify_proofs_batch


@dataclass
class MemberVerdict:
    guilty: bool = False
    proven: bool = True  # False: the evidence (link records, frames) cannot say who
    exact: bool = False  # guilty by its own signed records (no limit measured on a model decides it)
    reasons: list[str] = field(default_factory=list)
    worst: float = 0.0  # a stage before the last: the largest per-position relative error
    share_out: float = 0.0  # ...and the share of positions above `ForwardLimits.position`
    stats: StageStats = field(default_factory=StageStats)  # its proofs against the replay (`pooled.py`)


def evidence(bundle: GroupBundle, stage: int, received: list[list[bytes]], sent: list[list[bytes]],
             task_id: str, group_id: str, batch: int) -> MemberVerdict:  # fmt: skip
    """Whether the member's frames are bound by signed, agreeing link records (see the module doc)."""
    members = len(bundle.members)
    if len(bundle.links) != members - 1:
        return MemberVerdict(proven=False, reasons=[f"links: {len(bundle.links)} link records for {members} "
                                                    "members (an unsigned group): nobody can be blamed"])
    incoming = bundle.links[stage - 1] if stage > 0 else None
    outgoing = bundle.links[stage] if stage < members - 1 else None
    for record in (incoming, outgoing):
        if record is None:
            continue
        problem = record.problem(task_id, group_id, batch, bundle.members)
        if problem:
            return MemberVerdict(proven=False, reasons=[f"links: {problem}: nobody can be blamed"])
    own = _own_frames(incoming, outgoing, received, sent)
    return MemberVerdict(guilty=True, exact=True, reasons=[own]) if own else MemberVerdict()


def sealed_verdict(bundle: GroupBundle, stage: int, received: list[list[bytes]], sent: list[list[bytes]], *,
                   batch: int, hidden: int, max_new_tokens: int | None) -> MemberVerdict:  # fmt: skip
    """Every frame its links' seals cover, held to the batch (`sealed.py`): a contradiction in what it
    sent is its own (exact); in what it received, its predecessor's (this file proves nothing)."""
    members = len(bundle.members)
    if stage < members - 1:
        own = sealed.problem(sent, bundle, stage, batch=batch, hidden=hidden, max_new_tokens=max_new_tokens)
        own = own or (sealed.forwarded(received, sent, stage) if stage > 0 else None)
        if own:
            return MemberVerdict(guilty=True, exact=True, reasons=[f"sealed: what it sent: {own}"])
    if stage > 0:
        theirs = sealed.problem(received, bundle, stage - 1, batch=batch, hidden=hidden,
                                max_new_tokens=max_new_tokens)  # fmt: skip
        if theirs:
            why = f"sealed: what it received (stage {stage - 1}'s seal): {theirs}: not this member's fault"
            return MemberVerdict(proven=False, reasons=[why])
    return MemberVerdict()


def _own_frames(incoming: LinkRecord | None, outgoing: LinkRecord | None, received: list[list[bytes]],
                sent: list[list[bytes]]) -> str | None:  # fmt: skip
    if incoming is not None and frames_digest(received) != incoming.received_sha256:
        return ("frames: the frames this file says its member received are not those it countersigned "
                f"({frames_digest(received)[:12]}… against {incoming.received_sha256[:12]}…)")
    if outgoing is not None and frames_digest(sent) != outgoing.sha256:
        return ("frames: the frames this file says its member sent are not those it signed "
                f"({frames_digest(sent)[:12]}… against {outgoing.sha256[:12]}…)")
    return None


def activations(frames: list[list[bytes]], sender: int, rows: int) -> torch.Tensor:
    """The `act` frames of a batch as one [B, W + S - 1, H] tensor: step 0's prompt positions, then one
    position per later step. Raises `MemberMisbehaved` (naming `sender`) on anything else."""
    parts: list[torch.Tensor] = []
    for raw in frames:
        frame = parse_frame(sender, raw, FILE_HEADER_BYTES)
        if frame.header.get("kind") != "act":
            continue
        x = frame.tensor
        step = frame.header.get("step")
        if x is None or x.dim() != 3 or x.shape[0] != rows or step != len(parts) or (step and x.shape[1] - 1):
            got = None if x is None else tuple(x.shape)
            raise MemberMisbehaved(sender, f"an act frame of step {step!r}, shape {got} at step {len(parts)}")
        parts.append(x)
    if not parts:
        raise MemberMisbehaved(sender, "no activations in the batch's frames")
    return torch.cat(parts, dim=1)


def mask_positions(lengths: list[int], width: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts of `width`, then `steps` fed positions every row has (as `member.py` runs)."""
    mask = torch.zeros((len(lengths), width + steps), dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, width - n :] = 1
    mask[:, width:] = 1
    return mask, (mask.cumsum(-1) - 1).clamp_min(0)


def fed_ids(bundle: GroupBundle, width: int, steps: int, eos: int, pad: int) -> torch.Tensor:
    """Stage 0's input as it ran: the left-padded prompts, then each step's token (a finished row: pad)."""
    rows = len(bundle.prompts)
    ids = torch.full((rows, width + steps), pad, dtype=torch.long)
    for i, (p, o) in enumerate(zip(bundle.prompts, bundle.outputs, strict=True)):
        ids[i, width - len(p) : width] = torch.tensor(p)
        for s in range(1, steps + 1):
            if s - 1 < len(o) and o[s - 1] != eos:
                ids[i, width + s - 1] = o[s - 1]
    return ids


@torch.inference_mode()
def run_layers(model: PreTrainedModel, plan: StagePlan, x: torch.Tensor, mask: torch.Tensor,
               pos: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Stage `plan`'s part of the full model over `x` (token ids for stage 0, else activations) in one
    prefill: its layers only; the final norm only for the last stage, as the stage itself runs."""
    decoder = model.get_decoder()
    layers, norm = decoder.layers, decoder.norm
    decoder.layers = nn.ModuleList(list(layers)[plan.layers.start : plan.layers.stop])
    if not plan.last:
        decoder.norm = nn.Identity()
    try:
        kwargs = {"input_ids": x} if plan.first else {"inputs_embeds": x.to(model.dtype)}
        out = decoder(attention_mask=mask, position_ids=pos, use_cache=False, **kwargs)
        return out.last_hidden_state
    finally:
        decoder.layers, decoder.norm = layers, norm


@torch.inference_mode()
def judge_member(model: PreTrainedModel, plans: list[StagePlan], stage: int, bundle: GroupBundle,
                 received: list[list[bytes]], sent: list[list[bytes]], *, task_id: str, group_id: str,
                 batch: int, eos: int, pad: int, limits: ForwardLimits = TINY_FORWARD,
                 thresholds: GroupThresholds | None = None,
                 max_new_tokens: int | None = None) -> MemberVerdict:  # fmt: skip
    """Is member `stage` guilty on its own evidence (module doc)? `thresholds`: the last stage's proof
    and sampling limits."""
    th = thresholds or GroupThresholds()
    found = evidence(bundle, stage, received, sent, task_id, group_id, batch)
    if found.guilty or not found.proven:
        return found
    found = sealed_verdict(bundle, stage, received, sent, batch=batch, hidden=int(model.config.hidden_size),
                           max_new_tokens=max_new_tokens)  # fmt: skip
    if found.guilty or not found.proven:
        return found
    plan, rows = plans[stage], len(bundle.prompts)
    lengths = [len(p) for p in bundle.prompts]
    try:
        outgoing = activations(sent, stage, rows) if not plan.last else None
        incoming = activations(received, stage - 1, rows) if not plan.first else None
    except MemberMisbehaved as exc:
        return MemberVerdict(proven=False, reasons=[f"frames: {exc.reason}: nobody can be blamed"])
    shape = outgoing if outgoing is not None else incoming
    assert shape is not None
    total = int(shape.shape[1])
    steps = max(map(len, bundle.outputs))
    width = total - (steps - 1)
    unlike = incoming is not None and outgoing is not None and incoming.shape != outgoing.shape
    if width < max(lengths) or unlike:
        why = f"frames: {total} positions for prompts of up to {max(lengths)} and {steps} steps"
        return MemberVerdict(proven=False, reasons=[f"{why}: nobody can be blamed"])
    mask, pos = mask_positions(lengths, width, steps - 1)
    x = fed_ids(bundle, width, steps - 1, eos, pad) if plan.first else incoming
    assert x is not None
    replay = run_layers(model, plan, x, mask, pos)
    where = f"stage {stage} (layers {plan.layers.start}-{plan.layers.stop - 1})"
    if not plan.last:
        assert outgoing is not None
        guilty, why, figures = forward_verdict(Differences.of(outgoing, replay, mask), limits)
        proved = [replay[i, width - len(p) : width + len(o) - 1]
                  for i, (p, o) in enumerate(zip(bundle.prompts, bundle.outputs, strict=True))]  # fmt: skip
        stats = StageStats.of(verify_proofs_batch(proved, bundle.stage_proofs[stage], th.chunk, signed=True))
        verdict = MemberVerdict(worst=figures.worst, share_out=figures.share, stats=stats)
        if guilty:  # per position or over the file's mean (`tolerance.py`)
            verdict.guilty = True
            verdict.reasons.append(f"{where}: {why}")
        return verdict
    hiddens = [replay[i, width : width + len(o) - 1] for i, o in enumerate(bundle.outputs)]
    proofs = verify_proofs_batch(hiddens, bundle.stage_proofs[stage], th.chunk, signed=True)
    out = [i for i, v in enumerate(proofs) if not v.passed]
    stats = StageStats.of(proofs)
    if out:
        return MemberVerdict(True, reasons=[f"{where}: rows {out[:8]}: its final activations do not match "
                                            "the replay of what it received (TOPLOC)"], stats=stats)
    logits = model.lm_head(replay)
    row_logits = [logits[i, width - 1 : width + len(o) - 1] for i, o in enumerate(bundle.outputs)]
    faults = token_faults(row_logits, bundle.outputs, bundle.logprobs, bundle.seeds, bundle.temperature, th)
    if faults:
        return MemberVerdict(True, reasons=[f"{where}: sampling: {faults[0]}"], stats=stats)
    return MemberVerdict(stats=stats)
