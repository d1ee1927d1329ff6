"""The judge reads every frame a link's seal covers, metadata included, against the batch (issue 55).

A sealed link log (`transport.LinkLog`) holds, for a link k → k+1 and one batch, exactly: step 0's
activations with the batch's shape (lengths, seeds, limit, temperature, prompts, members, number,
policy), one activation frame per later step, the end frame (the rows' output lengths) and the
sender's proofs frame (its proofs and every earlier stage's). Before this module the replay read only
the tensors, so a lie in the rest (a header that names other seeds, an end that says other lengths,
proofs that are not the bundle's) was sealed by its sender but never examined, and whoever received
it paid for it. Now every frame and every field is held to the batch the file states:

- in a member's **sent** log (its own seal): any contradiction is its own fault (`invalidate`, exact:
  no measured limit decides it);
- in its **received** log (its predecessor's seal, countersigned by it): any contradiction is the
  predecessor's, never this member's: its file proves nothing (`soft_invalidate`), and the
  predecessor's own file carries the same frames as sent.

An honest member can never fail here: it checks every frame it receives (`inbound.py`) and forwards
the step-0 shape unchanged, and the bundle it writes must state what it ran (`inbound.bundle_fits`).
"""

from __future__ import annotations

from typing import Any

import torch

from workloads.pipeline.bundle import GroupBundle
from workloads.pipeline.inbound import SHAPE
from workloads.pipeline.transport import FILE_HEADER_BYTES, MemberMisbehaved, parse_frame

DTYPE = torch.bfloat16  # what every stage sends (`stages.load_stage`)


def problem(frames: list[list[bytes]], bundle: GroupBundle, sender: int, *, batch: int, hidden: int,
            max_new_tokens: int | None = None) -> str | None:  # fmt: skip
    """What in the sealed log of link `sender` → `sender + 1` contradicts the batch `bundle` states
    (None: every frame is what an honest sender sends for it)."""
    try:
        _check(frames, bundle, sender, batch, hidden, max_new_tokens)
    except MemberMisbehaved as exc:
        return exc.reason
    return None


def _check(frames: list[list[bytes]], bundle: GroupBundle, sender: int, batch: int, hidden: int,
           max_new_tokens: int | None) -> None:  # fmt: skip
    rows, steps = len(bundle.prompts), max(len(o) for o in bundle.outputs)
    if len(frames) != steps + 2:
        raise MemberMisbehaved(sender, f"{len(frames)} frames for a batch of {steps} steps (the step frames, "
                                       "the end and the proofs)")  # fmt: skip
    parsed = [parse_frame(sender, parts, FILE_HEADER_BYTES) for parts in frames]
    first = parsed[0].header
    _fields(sender, first, {"kind", "step", "shape", "dtype", *SHAPE}, "step 0's frame")
    want: dict[str, Any] = {"kind": "act", "step": 0, "lengths": [len(p) for p in bundle.prompts],
                            "seeds": bundle.seeds, "temperature": bundle.temperature,
                            "prompts": bundle.prompts, "members": bundle.members, "batch": batch,
                            "policy": bundle.policy.header()}  # fmt: skip
    if max_new_tokens is not None:
        want["max_new_tokens"] = max_new_tokens
    wrong = [k for k, v in want.items() if first.get(k) != v]
    if wrong:
        raise MemberMisbehaved(sender, f"step 0's frame states {', '.join(wrong)} other than the batch's")
    width = max(len(p) for p in bundle.prompts)
    _activations(sender, parsed[0].tensor, (rows, width, hidden), "step 0")
    for step in range(1, steps):
        frame = parsed[step]
        _fields(sender, frame.header, {"kind", "step", "shape", "dtype"}, f"step {step}'s frame")
        if frame.header.get("kind") != "act" or frame.header.get("step") != step:
            raise MemberMisbehaved(sender, f"frame {step} is not step {step}'s activations")
        _activations(sender, frame.tensor, (rows, 1, hidden), f"step {step}")
    end, proofs = parsed[steps].header, parsed[steps + 1].header
    _fields(sender, end, {"kind", "lengths"}, "the end frame")
    if end.get("kind") != "end" or end.get("lengths") != [len(o) for o in bundle.outputs]:
        raise MemberMisbehaved(sender, "the end frame states output lengths other than the batch's")
    _fields(sender, proofs, {"kind", "proofs", "earlier"}, "the proofs frame")
    stated = [[p.hex() for p in stage] for stage in bundle.stage_proofs]
    if proofs.get("kind") != "proofs" or proofs.get("proofs") != stated[sender] or \
            proofs.get("earlier") != stated[:sender]:  # fmt: skip
        raise MemberMisbehaved(sender, "the proofs frame states proofs other than the batch's")


def _fields(sender: int, header: dict[str, Any], allowed: set[str], what: str) -> None:
    if set(header) != allowed:
        raise MemberMisbehaved(sender, f"{what} names fields {sorted(set(header) ^ allowed)[:4]} "
                                       "an honest sender does not")  # fmt: skip


def _activations(sender: int, x: torch.Tensor | None, shape: tuple[int, ...], what: str) -> None:
    if x is None or x.dtype != DTYPE or tuple(x.shape) != shape:
        got = None if x is None else f"{x.dtype} {tuple(x.shape)}"
        raise MemberMisbehaved(sender, f"{what}'s activations are {got}, the batch's {DTYPE} {shape}")
    if not bool(torch.isfinite(x).all()):
        raise MemberMisbehaved(sender, f"{what}'s activations hold values that are not finite")


def forwarded(received: list[list[bytes]], sent: list[list[bytes]], stage: int) -> str | None:
    """What a member between two others passes on unchanged, against what it received (both logs
    sealed): step 0's shape, the end's lengths, and every earlier stage's proofs (the ones it received
    and its predecessor's). A change there is its own, whatever the bundle says."""
    try:
        got = [parse_frame(stage - 1, parts, FILE_HEADER_BYTES).header for parts in received]
        gave = [parse_frame(stage, parts, FILE_HEADER_BYTES).header for parts in sent]
    except MemberMisbehaved as exc:
        return exc.reason
    if len(got) != len(gave) or len(got) < 3:
        return f"it sent {len(gave)} frames for the {len(got)} it received"
    if any(got[0].get(k) != gave[0].get(k) for k in SHAPE):
        return "it passed on step 0's shape other than it received it"
    if got[-2].get("lengths") != gave[-2].get("lengths"):
        return "it passed on output lengths other than it received"
    proofs = got[-1]
    before = proofs.get("earlier")
    got_proofs = [*before, proofs.get("proofs")] if isinstance(before, list) else None  # whatever it was sent
    if gave[-1].get("earlier") != got_proofs:
        return "it passed on earlier stages' proofs other than it received"
    return None
