"""A fuzzer over what one group member sends: any field of any frame, values and metadata, frame count
and order (issue 55). Tests and `bench/pipeline_fuzz.py` only.

One member of a 2- or 3-member thread group (`group.run_thread_group`, real CURVE links on loopback,
every member its own node key) is replaced by an `Adversary`: a member that runs the protocol and, at
one frame, changes one thing (`Mutation`). Changes to activation values go through the member's output
before it proves, logs and sends it, so its proofs and its seal cover exactly what it sent; changes to a
frame's header, tensor metadata, count or order are made to the frame as it leaves, and where the
protocol logs that frame whole (step 0, the proofs) the seal covers them too.

Every case is then judged as the product judges it (`judge_case`): an honest member writes a file only
when its batch ended (its own checks and self-judge passed) and the batch is the task's plan; each file
is judged by `judge.replay.judge_member` and the end-to-end `judge.end_to_end.judge_group`. The properties:
- no honest member's file is ever `invalidate`;
- a batch whose tokens differ from the honest run's is never paid to anyone, unless the adversary's own
  file is clean too (its change inside the judge's documented tolerance: counted, and reported by the
  bench as what the tolerance leaves).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from workloads.pipeline.flight import InFlight
from workloads.pipeline.member import Member

FRAMES = ("act0", "act", "end", "proofs", "seal", "tok", "bundle")
HEADER_HOW = ("delete", "extra", "type", "plus", "minus", "empty", "nan", "huge")
TENSOR_HOW = ("dtype", "shape-row", "shape-pos")
VALUE_HOW = ("nan", "inf", "huge", "all-huge", "zero", "tiny", "scale", "negate", "noise", "bias", "rows")
ORDER_HOW = ("dup", "swap", "extra-after")


@dataclass(frozen=True)
class Mutation:
    """One change: to frame `frame` (its `at`-th occurrence), of `what` ("value", "header", "tensor" or
    "order"), field `key` (a header key), as `how`."""

    what: str
    frame: str
    how: str
    key: str = ""
    at: int = 0
    seed: int = 0

    def __str__(self) -> str:
        return f"{self.what}:{self.frame}[{self.at}].{self.key or '-'}:{self.how}"


def draw(rng: random.Random, last: bool, first: bool) -> Mutation:
    """A mutation a member of this position could make (the last stage sends tokens, not activations)."""
    frames = [f for f in FRAMES if (f == "tok") == last or f in ("bundle",)]
    if first:
        frames = [f for f in frames if f != "bundle"]  # stage 0 never sends the bundle onward
    if last:
        frames = ["tok", "bundle"]
    what = rng.choice(["value", "header", "header", "tensor", "order"] if not last else ["header", "order"])
    seed = rng.randrange(1 << 30)
    if what == "value":
        return Mutation("value", "act", rng.choice(VALUE_HOW), at=rng.choice([0, 0, 1, 2, 5]), seed=seed)
    frame = rng.choice(frames)
    if what == "tensor" and frame in ("act0", "act"):
        at = rng.choice([0, 1, 3]) if frame == "act" else 0
        return Mutation("tensor", frame, rng.choice(TENSOR_HOW), at=at, seed=seed)
    at = rng.choice([0, 1, 3]) if frame in ("act", "tok") else 0  # the others are sent once a batch
    if what == "order":
        return Mutation("order", frame, rng.choice(ORDER_HOW), at=at, seed=seed)
    return Mutation("header", frame, rng.choice(HEADER_HOW), key=rng.choice(KEYS[frame]), at=at, seed=seed)


KEYS: dict[str, tuple[str, ...]] = {
    "act0": ("step", "lengths", "seeds", "max_new_tokens", "temperature", "prompts", "members", "batch",
             "policy", "signature", "shape", "dtype"),
    "act": ("step", "keep", "shape", "dtype"),
    "end": ("lengths", "keep"),
    "proofs": ("proofs", "earlier"),
    "seal": ("sha256", "signature", "links"),
    "tok": ("step", "tokens", "logprobs"),
    "bundle": ("members", "prompts", "outputs", "logprobs", "seeds", "temperature", "stage_proofs", "policy",
               "links"),
}  # fmt: skip


def change(value: Any, how: str, rng: random.Random) -> Any:
    """`value` changed as `how` says, whatever its type (deep inside lists and objects)."""
    if how == "type":
        return "x" if not isinstance(value, str) else 7
    if how == "empty":
        return type(value)() if isinstance(value, (list, dict, str)) else 0
    if how == "nan":
        return _leaf(value, lambda _v: math.nan, rng)
    if how == "huge":
        return _leaf(value, lambda v: 10**30 if isinstance(v, int) else 1e300, rng)
    sign = 1 if how == "plus" else -1
    return _leaf(value, lambda v: _nudge(v, sign), rng)


def _nudge(v: Any, sign: int) -> Any:
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + sign
    if isinstance(v, float):
        return v * (1.5 if sign > 0 else -1)
    if isinstance(v, str):
        return (v[:-1] + ("0" if v[-1:] != "0" else "1")) if v else "0"
    return v


def _leaf(value: Any, fn: Any, rng: random.Random) -> Any:
    """`fn` applied to one leaf of `value` (a random element of a list, a random field of an object)."""
    if isinstance(value, list) and value:
        i = rng.randrange(len(value))
        return [*value[:i], _leaf(value[i], fn, rng), *value[i + 1 :]]
    if isinstance(value, dict) and value:
        k = rng.choice(sorted(value))
        return {**value, k: _leaf(value[k], fn, rng)}
    return fn(value)


def mutate_values(out: torch.Tensor, how: str, rng: random.Random) -> torch.Tensor:
    """Activations [B, T, H] changed as `how` says (in the tensor's own dtype)."""
    x = out.float().clone()
    b, t, h = rng.randrange(x.shape[0]), rng.randrange(x.shape[1]), rng.randrange(x.shape[2])
    rms = x.pow(2).mean(dim=-1, keepdim=True).sqrt()
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    if how in ("nan", "inf", "huge"):
        x[b, t, h] = {"nan": math.nan, "inf": math.inf, "huge": 1e30}[how]
    elif how == "all-huge":
        x = x * 1e30
    elif how == "zero":
        x = torch.zeros_like(x)
    elif how == "tiny":
        x = x * 1e-30
    elif how == "scale":
        x = x * 3
    elif how == "negate":
        x = -x
    elif how == "noise":
        x = x + torch.randn(x.shape, generator=g) * 0.005 * rms
    elif how == "bias":
        x = x + 0.01 * rms
    elif how == "rows" and x.shape[0] > 1:
        x = x.roll(1, dims=0)
    return x.to(out.dtype)


class Adversary(Member):
    """A member that changes one thing it sends (`mutation`); otherwise the protocol as an honest member
    runs it (its own checks off: a dishonest member writes its file whatever it holds)."""

    def __init__(self, *args: Any, mutation: Mutation, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.checker = None
        self.mutation = mutation
        self.rng = random.Random(mutation.seed)
        self.seen: dict[str, int] = {}
        self.held: tuple[dict[str, Any], torch.Tensor | None, bool] | None = None

    def _tamper(self, out: torch.Tensor) -> torch.Tensor:
        m = self.mutation
        count = self.seen.get("value", 0)
        self.seen["value"] = count + 1
        if m.what == "value" and count == m.at:
            return mutate_values(out, m.how, self.rng)
        return out

    def _send(self, batch: InFlight, header: dict[str, Any], tensor: torch.Tensor | None = None, *,
              log: bool = True) -> None:  # fmt: skip
        kind = header.get("kind", "")
        name = "act0" if kind == "act" and header.get("step") == 0 else str(kind)
        count = self.seen.get(name, 0)
        self.seen[name] = count + 1
        m = self.mutation
        if m.what in ("header", "tensor", "order") and m.frame == name and count == m.at:
            self._mutated(batch, header, tensor, log)
        else:
            self._plain(batch, header, tensor, log)
        if self.held is not None and name != m.frame:  # "swap": the held frame goes after this one
            held, self.held = self.held, None
            self._plain(batch, *held)

    def _plain(self, batch: InFlight, header: dict[str, Any], tensor: torch.Tensor | None, log: bool) -> None:
        kept = batch.sent if log else None
        batch.bytes_sent += self._link.send(header, tensor, route=batch.route, log=kept)

    def _mutated(self, batch: InFlight, header: dict[str, Any], tensor: torch.Tensor | None,
                 log: bool) -> None:  # fmt: skip
        m = self.mutation
        if m.what == "header":
            header = dict(header)
            if m.how == "delete":
                header.pop(m.key, None)
            elif m.how == "extra":
                header["unasked"] = 1
            elif m.key in header:
                header[m.key] = change(header[m.key], m.how, self.rng)
            self._plain(batch, header, tensor, log)
        elif m.what == "tensor" and tensor is not None:
            if m.how == "dtype":
                tensor = tensor.float()
            elif m.how == "shape-row" and tensor.shape[0] > 1:
                tensor = tensor[1:]
            elif m.how == "shape-pos":
                tensor = torch.cat([tensor, tensor[:, -1:]], dim=1)
            self._plain(batch, header, tensor, log)
        elif m.how == "dup":
            self._plain(batch, header, tensor, log)
            self._plain(batch, header, tensor, log)
        elif m.how == "swap":
            self.held = (header, tensor, log)
        elif m.how == "extra-after":
            self._plain(batch, header, tensor, log)
            self._link.send({"kind": "act", "step": 999}, tensor, route=batch.route)
        else:
            self._plain(batch, header, tensor, log)


@dataclass
class Case:
    """One fuzz case: who cheated how, what each member's file would get, what broke a property."""

    members: int
    index: int
    mutation: Mutation
    stopped: bool = False  # the batch stopped at some member (nothing written by it)
    # member that stopped on a frame → the member it named (those that then waited in vain are not here)
    named: dict[int, int | None] = field(default_factory=dict)
    verdicts: dict[int, str] = field(default_factory=dict)  # member → accept / soft / invalidate / none
    failures: list[str] = field(default_factory=list)
    within: list[str] = field(default_factory=list)  # changed tokens paid, the change inside the tolerance

    def __str__(self) -> str:
        return f"{self.index} of {self.members}: {self.mutation} → {self.verdicts or 'stopped'}"


class Fuzzer:
    """Runs cases on the tiny model: one honest run per group size for the reference tokens, then each
    case as a thread group whose member `index` is an `Adversary`, judged as the validator judges."""

    def __init__(self, model: str = "tiny", rows: int = 3, tokens: int = 6, timeout: float = 2.0,
                 admit: bool = True) -> None:  # fmt: skip
        from workloads.model.loading import load_model, load_tokenizer
        from workloads.pipeline.bundle import BatchRequest
        from workloads.pipeline.stages import load_stage, plan_stages

        self.model_name, self.timeout, self.admits = model, timeout, admit
        self.tok = load_tokenizer(model)
        self.model = load_model(model)
        prompts = [list(self.tok(f"reverse: {w}")["input_ids"]) for w in ("abc", "pipeline", "to")[:rows]]
        self.request = BatchRequest(prompts, [11 + i for i in range(len(prompts))], tokens, 1.0)
        self.plans = {n: plan_stages(model, n) for n in (2, 3)}
        default = torch.get_default_dtype()
        self.stages = {n: [load_stage(model, p) for p in plans] for n, plans in self.plans.items()}
        torch.set_default_dtype(default)
        self.reference = {n: self._run(n, None).outputs[0].tokens for n in (2, 3)}

    def _run(self, members: int, adversary: tuple[int, Mutation] | None) -> Any:
        from functools import partial

        from workloads.pipeline.group import run_thread_group

        def factory(i: int) -> Callable[..., Member] | None:
            if adversary is not None and i == adversary[0]:
                return partial(Adversary, mutation=adversary[1])
            return partial(Member, admit=self._admit) if self.admits else None

        return run_thread_group(members, self.request, model=self.model_name, timeout=self.timeout,
                                stages=self.stages[members], factory=factory)  # fmt: skip

    def _admit(self, shape: dict[str, Any]) -> list[str]:
        """The task's plan, as `workload.py` holds a step-0 shape to it (here: the one request)."""
        r = self.request
        want = {"prompts": r.prompts, "seeds": r.seeds, "temperature": r.temperature,
                "max_new_tokens": r.max_new_tokens, "batch": 1, "policy": r.policy.header()}  # fmt: skip
        return [f"{k} is not the plan's" for k, v in want.items() if shape[k] != v]

    def case(self, members: int, index: int, mutation: Mutation) -> Case:
        run = self._run(members, (index, mutation))
        found = Case(members, index, mutation, stopped=bool(run.errors))
        found.named = {i: e.get("member") for i, e in run.errors.items() if not e.get("timeout")}
        for i, error in run.errors.items():
            if error.get("crash") and i != index:
                found.failures.append(f"honest member {i} crashed, naming nobody: {error['error']}")
        for i, out in run.outputs.items():
            found.verdicts[i] = self._verdict(members, i, out, honest=i != index)
            if found.verdicts[i] == "invalidate" and i != index:
                found.failures.append(f"honest member {i}'s file invalidated")
        changed = [i for i, v in found.verdicts.items()
                   if v == "accept" and run.outputs[i].bundle.outputs != self.reference[members]]  # fmt: skip
        if changed:
            # Paid tokens the honest group does not draw: allowed only where the adversary's own change
            # is inside what the judge tolerates (its file, replayed from what it received, is clean:
            # docs/pipeline.md says what a forwarder can still change unseen, and the sampling replay's
            # near-tie slack lets one flipped token a row through); never when its change is provable.
            clean = found.verdicts.get(index) == "accept"
            target = found.within if clean else found.failures
            target.append(f"members {changed} paid for tokens the honest group does not draw")
        return found

    def _verdict(self, members: int, i: int, out: Any, honest: bool) -> str:
        """What the validator's judge would give member `i`'s file (an honest member writes none for a
        batch that is not the task's plan: `workload.py` checks it before writing)."""
        from workloads.pipeline.judge.end_to_end import GroupRows, judge_group
        from workloads.pipeline.judge.replay import judge_member

        b, r = out.bundle, self.request
        planned = b.prompts == r.prompts and b.seeds == r.seeds and b.temperature == r.temperature
        if not planned:
            return "none" if honest else "invalidate"
        eos, pad = int(self.tok.eos_token_id), int(self.tok.pad_token_id)
        local = judge_member(self.model, self.plans[members], i, b, out.received_frames, out.sent_frames,
                             task_id="local", group_id="local", batch=1, eos=eos, pad=pad,
                             max_new_tokens=r.max_new_tokens)  # fmt: skip
        if local.guilty:
            return "invalidate"
        if not local.proven and b.links:
            return "soft"
        rows = GroupRows(b.prompts, b.outputs, b.logprobs, b.seeds, b.stage_proofs, b.temperature)
        return "accept" if judge_group(self.model, self.plans[members], rows, pad).accepted else "soft"

    def run(self, cases: int, seed: int = 0) -> list[Case]:
        """`cases` drawn from `seed`: a member of a 2- or 3-member group, one mutation each."""
        rng = random.Random(seed)
        out = []
        for _ in range(cases):
            members = rng.choice((2, 3))
            index = rng.randrange(members)
            out.append(self.case(members, index, draw(rng, index == members - 1, index == 0)))
        return out
