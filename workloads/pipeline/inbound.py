"""What a member checks of every frame it receives before it acts on it (issue 55).

A partner that proves and seals exactly what it sends can still feed an honest member frames that the
honest member would run on and then be judged on: values that are not finite, a tensor of another
dtype, a header with a field more or a field of another type, lengths or tokens that contradict what
the member holds itself. Whatever is trusted somewhere is an opening, so the rule is by construction:
every field of every frame is checked here, against the protocol (the exact set of header keys per
frame kind, their types and bounds) and against what this member already holds (the batch's shape from
step 0, its own step count, its own tokens). Any contradiction raises `MemberMisbehaved` naming the
sender, before the frame is used: the batch stops, nothing is written, nobody is judged.

The last line of defence is `selfcheck.py`: before a member ends a batch it judges its own file as a
validator would, so even a case no rule here foresaw cannot make it write a file its judge fails.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from workloads.pipeline.transport import Frame, MemberMisbehaved

MAX_SEED = 2**63 - 1  # seeds are drawn below this (`workloads.inference.selection.SEED_HIGH`)
MAX_TOKENS = 1 << 16  # a batch's max_new_tokens can never be above this (the task's own cap is 4,096)

# A batch's shape as the step-0 header carries it, in the order the driver writes it (a follower
# forwards it in this order: the bytes it seals are the same on every run).
SHAPE = ("lengths", "seeds", "max_new_tokens", "temperature", "prompts", "members", "batch", "policy",
         "signature")  # the driver's signature over the rest ("" in a group that signs nothing)
# The header keys each frame kind carries: exactly these, no more (a field the protocol does not name
# is a field some code might one day read without checking). `shape`/`dtype` come with a tensor.
STEP0_KEYS = frozenset({"kind", "step", "shape", "dtype", *SHAPE})
TRIP_KEYS = frozenset({"kind", "step", "keep", "shape", "dtype"})
END_KEYS = frozenset({"kind", "lengths", "keep"})
TOK_KEYS = frozenset({"kind", "step", "tokens", "logprobs"})
PROOFS_KEYS = frozenset({"kind", "proofs", "earlier"})
SEAL_KEYS = frozenset({"kind", "sha256", "signature", "links"})
BUNDLE_KEYS = frozenset({"kind", "members", "prompts", "outputs", "logprobs", "seeds", "temperature",
                         "stage_proofs", "policy", "links"})  # fmt: skip


def keys(sender: int, frame: Frame, allowed: frozenset[str]) -> None:
    """The frame's header names exactly `allowed`."""
    got = set(frame.header)
    if got != allowed:
        extra, missing = sorted(got - allowed)[:4], sorted(allowed - got)[:4]
        kind = frame.header.get("kind")
        raise MemberMisbehaved(sender, f"a {kind!r} frame with fields {extra} the protocol does not name "
                                       f"and without {missing}")  # fmt: skip


def ints(sender: int, value: Any, what: str, low: int, high: int) -> list[int]:
    """A list of ints (not bools) in [low, high]."""
    if not isinstance(value, list) or not all(type(v) is int and low <= v <= high for v in value):
        raise MemberMisbehaved(sender, f"{what} that are not integers in [{low}, {high}]")
    return value


def tensor(sender: int, frame: Frame, shape: tuple[int, ...], dtype: torch.dtype, what: str) -> torch.Tensor:
    """The frame's activations: present, of exactly `shape` and `dtype`, every value finite."""
    x = frame.tensor
    if x is None:
        raise MemberMisbehaved(sender, f"{what} without activations")
    if x.dtype != dtype or tuple(x.shape) != shape:
        got = f"{x.dtype} {tuple(x.shape)}"
        raise MemberMisbehaved(sender, f"{what} of {got}, the batch's are {dtype} {shape}")
    if not bool(torch.isfinite(x).all()):
        raise MemberMisbehaved(sender, f"{what} holding values that are not finite (NaN or infinity)")
    return x


def step0_shape(sender: int, frame: Frame, hidden: int, vocab: int, dtype: torch.dtype) -> dict[str, Any]:
    """A batch's step-0 header, every field checked: what a follower runs the batch with."""
    keys(sender, frame, STEP0_KEYS)
    h = frame.header
    prompts = h["prompts"]
    if not isinstance(prompts, list) or not prompts or len(prompts) > 4096:
        raise MemberMisbehaved(sender, "a step-0 header without its rows' prompts")
    for p in prompts:
        ints(sender, p, "prompt tokens", 0, vocab - 1)
        if not p:
            raise MemberMisbehaved(sender, "a step-0 header with an empty prompt")
    lengths = ints(sender, h["lengths"], "prompt lengths", 1, 1 << 20)
    seeds = ints(sender, h["seeds"], "seeds", 0, MAX_SEED)
    rows = len(prompts)
    if lengths != [len(p) for p in prompts] or len(seeds) != rows:
        raise MemberMisbehaved(sender, "a step-0 header whose prompts, lengths and seeds do not fit")
    temperature, limit, number = h["temperature"], h["max_new_tokens"], h["batch"]
    if type(temperature) not in (int, float) or not (math.isfinite(temperature) and temperature > 0):
        raise MemberMisbehaved(sender, f"a step-0 header with temperature {temperature!r}")
    if type(limit) is not int or not 1 <= limit <= MAX_TOKENS or type(number) is not int or number < 1:
        raise MemberMisbehaved(sender, f"a step-0 header with batch {number!r}, limit {limit!r}")
    members = h["members"]
    if not isinstance(members, list) or not all(isinstance(m, str) and len(m) <= 200 for m in members):
        raise MemberMisbehaved(sender, "a step-0 header whose members are not addresses")
    if not isinstance(h["signature"], str) or len(h["signature"]) > 200:
        raise MemberMisbehaved(sender, "a step-0 header whose driver's signature is not a signature")
    tensor(sender, frame, (rows, max(lengths), hidden), dtype, "step 0's activations")
    return {k: h[k] for k in SHAPE}


def trip(sender: int, frame: Frame, step: int, rows: int, most: int, hidden: int,
         dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
    """A trip's activations after step 0: at `step`, up to `most` positions of every row."""
    keys(sender, frame, TRIP_KEYS)
    x = frame.tensor
    width = int(x.shape[1]) if x is not None and x.dim() == 3 else 0
    if frame.header.get("step") != step or not 1 <= width <= most:
        raise MemberMisbehaved(sender, f"activations of step {frame.header.get('step')!r} at step {step}, "
                                       f"{width} positions (at most {most})")  # fmt: skip
    return tensor(sender, frame, (rows, width, hidden), dtype, f"step {step}'s activations")


def end_lengths(sender: int, frame: Frame, rows: int, steps: int, own: list[int] | None) -> list[int]:
    """The end frame's output lengths: one per row, each in [1, steps run]; equal to `own` where this
    member counts them itself (the last stage samples them, stage 0 feeds them)."""
    keys(sender, frame, END_KEYS)
    lengths = ints(sender, frame.header["lengths"], "output lengths", 1, steps)
    if len(lengths) != rows or (own is not None and lengths != own):
        raise MemberMisbehaved(sender, f"an end frame with lengths {lengths[:8]}, the batch's are "
                                       f"{(own or [])[:8]}")  # fmt: skip
    return lengths


def tokens(sender: int, frame: Frame, step: int, positions: int, rows: int,
           vocab: int) -> list[tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """The last stage's tokens and logprobs of a trip (stage 0 receives them), per position."""
    if frame.header.get("kind") == "end" or frame.header.get("step") != step:
        raise MemberMisbehaved(sender, f"tokens of step {frame.header.get('step')!r} at {step}")
    keys(sender, frame, TOK_KEYS)
    toks, lps = frame.header["tokens"], frame.header["logprobs"]
    if not (isinstance(toks, list) and isinstance(lps, list) and len(toks) == len(lps) == positions):
        raise MemberMisbehaved(sender, f"tokens for {len(toks) if isinstance(toks, list) else 0} steps, "
                                       f"the trip ran {positions}")  # fmt: skip
    out = []
    for t, lp in zip(toks, lps, strict=True):
        ints(sender, t, "tokens", 0, vocab - 1)
        finite = isinstance(lp, list) and all(type(v) in (int, float) and math.isfinite(v) and v <= 1e-3
                                               for v in lp)  # fmt: skip
        if len(t) != rows or not finite or len(lp) != rows:
            raise MemberMisbehaved(sender, f"a tokens frame not of {rows} tokens and finite logprobs ≤ 0")
        out.append((torch.tensor(t, dtype=torch.long), torch.tensor(lp, dtype=torch.float32)))
    return out


def proofs(sender: int, frame: Frame, rows: int, earlier: int) -> tuple[list[bytes], list[list[bytes]]]:
    """A proofs frame: the sender's proofs, one per row, and every stage before it's, as hex."""
    keys(sender, frame, PROOFS_KEYS)
    theirs, before = frame.header["proofs"], frame.header["earlier"]
    try:
        if not isinstance(before, list) or len(before) != earlier:
            raise ValueError
        stages = [_hex_rows(theirs, rows)] + [_hex_rows(s, rows) for s in before]
    except (TypeError, ValueError):
        raise MemberMisbehaved(sender, f"a proofs frame that is not {rows} hex proofs for each of "
                                       f"{earlier + 1} stages") from None  # fmt: skip
    return stages[0], stages[1:]


def _hex_rows(value: Any, rows: int) -> list[bytes]:
    if not isinstance(value, list) or len(value) != rows or not all(isinstance(p, str) for p in value):
        raise ValueError
    return [bytes.fromhex(p) for p in value]


def seal(sender: int, frame: Frame) -> None:
    keys(sender, frame, SEAL_KEYS)


def bundle(sender: int, frame: Frame) -> None:
    keys(sender, frame, BUNDLE_KEYS)


def finite_output(sender: int, out: torch.Tensor) -> None:
    """This member's own output from what it was fed: a finite input can still drive a stage's layers
    past bf16's range. It never sends nor proves that; the batch stops, naming who fed it."""
    if not bool(torch.isfinite(out).all()):
        raise MemberMisbehaved(sender, "activations that drive this stage's layers to values that are not "
                                       "finite")  # fmt: skip


def bundle_fits(sender: int, got: Any, shape: dict[str, Any], lengths: list[int], vocab: int) -> None:
    """The bundle that came round the ring states the batch this member ran: the step-0 header's members,
    prompts, seeds and temperature (stage 0: its own request's), outputs of the lengths the end frame
    said, tokens of the vocabulary and finite logprobs, one proof per row and stage."""
    rows = len(shape["prompts"])
    same = (got.members == list(shape["members"]) and got.prompts == [list(p) for p in shape["prompts"]]
            and got.seeds == list(shape["seeds"])
            and got.temperature == float(shape["temperature"]))  # fmt: skip
    if not same:
        raise MemberMisbehaved(sender, "a bundle whose members, prompts, seeds or temperature are not the "
                                       "batch's")  # fmt: skip
    outputs = got.outputs if isinstance(got.outputs, list) else []
    counts = [len(o) if isinstance(o, list) else -1 for o in outputs]
    if counts != lengths:
        raise MemberMisbehaved(sender, "a bundle whose outputs are not of the lengths the batch ended with")
    for o, lp in zip(got.outputs, got.logprobs if isinstance(got.logprobs, list) else [], strict=False):
        ints(sender, o, "output tokens", 0, vocab - 1)
        if not isinstance(lp, list) or len(lp) != len(o) or not all(
                type(v) in (int, float) and math.isfinite(v) and v <= 1e-3 for v in lp):  # fmt: skip
            raise MemberMisbehaved(sender, "a bundle whose logprobs are not one finite logprob ≤ 0 a token")
    if not isinstance(got.logprobs, list) or len(got.logprobs) != rows:
        raise MemberMisbehaved(sender, "a bundle whose logprobs are not one list a row")
    if any(len(stage) != rows for stage in got.stage_proofs):
        raise MemberMisbehaved(sender, "a bundle whose proofs are not one a row at every stage")
