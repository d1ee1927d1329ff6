"""One group member's decode loop: receive, run its stage, send; prove what it sent.

Stage 0 (the driver) holds the batch: prompts (left-padded, as `TorchBackend` pads them) and seeds.
At step 0 it runs the prompts through its layers and sends the activations with the batch's shape
(prompt lengths, seeds, limits) to member 1; each member runs its layers and passes its output on;
the last member samples with the seeded Gumbel sampler (the same tokens one node would draw) and
sends tokens and logprobs back to stage 0, which feeds them in as the next step's input. Stage 0 ends
the batch (every row at EOS or at max_new_tokens) with an `end` frame that travels the ring.

Proofs: each member commits (TOPLOC) to the activations it *sent*: a non-last stage to its output at
every real position (the prompt's and each fed output token's), the last stage to its final-norm
output at the decode positions (a single node's proof). After `end`, each non-last member sends its
proofs to the next one, which builds the proofs of what it received and compares: a member that
proves one thing and sends another is caught there (`MemberMisbehaved`), so the proofs a validator
replays are always those of the activations the next stage really ran on.

The bundle: the step-0 header carries the prompts and the members' node addresses (each member adds
its own as it passes the header on), the proofs frames carry every earlier stage's proofs, and the last
member sends the whole batch (members, prompts, tokens, logprobs, seeds, every stage's proofs) back
round the ring to every other member, each of which checks its own part. So every member ends the
batch holding the same `GroupBundle`: the file it uploads, and the one a validator judges.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from workloads.model import sampler
from workloads.pipeline.options import Cheat
from workloads.pipeline.stages import Stage
from workloads.pipeline.transport import MemberLink, MemberMisbehaved
from workloads.toploc.proof import build_proofs_batch as _build_proofs


@dataclass(frozen=True)
class Policy:
    """The weights a batch is made with: the trainer's step it was made for and the checkpoint (its step,
    0 = the base model, and the sha256 of its file). The driver picks it; it travels in the step-0
    header so every member loads that checkpoint's layers before running the batch."""

    step: int = 0
    checkpoint_step: int = 0
    checkpoint_sha256: str | None = None

    @property
    def weights(self) -> tuple[int, str | None]:
        """What a member loads: the checkpoint (a new trainer step alone changes nothing to load)."""
        return self.checkpoint_step, self.checkpoint_sha256

    def header(self) -> dict[str, Any]:
        return {"step": self.step, "checkpoint_step": self.checkpoint_step, "sha256": self.checkpoint_sha256}

    @classmethod
    def from_header(cls, header: Any) -> Policy:
        if not isinstance(header, dict):
            raise ValueError("a policy must be an object")
        step, checkpoint, sha = header.get("step"), header.get("checkpoint_step"), header.get("sha256")
        if not (isinstance(step, int) and isinstance(checkpoint, int) and 0 <= checkpoint <= step):
            raise ValueError(f"a policy of step {step!r} with checkpoint {checkpoint!r}")
        if sha is not None and (not isinstance(sha, str) or len(sha) != 64):
            raise ValueError("a checkpoint sha256 that is not 64 hex digits")
        return cls(step, checkpoint, sha)


@dataclass
class BatchRequest:
    """What the driver (stage 0) is asked to generate."""

    prompts: list[list[int]]
    seeds: list[int]
    max_new_tokens: int
    temperature: float
    batch: int = 1  # its number in the task (named in every member's file)
    policy: Policy = field(default_factory=Policy)


@dataclass
class GroupBundle:
    """A group's batch as every member holds it at the end: what a validator judges."""

    members: list[str]  # node addresses, stage order
    prompts: list[list[int]]
    outputs: list[list[int]]
    logprobs: list[list[float]]
    seeds: list[int]
    temperature: float
    stage_proofs: list[list[bytes]]  # per stage, one proof per row
    policy: Policy = field(default_factory=Policy)

    def header(self) -> dict[str, Any]:
        return {"kind": "bundle", "members": self.members, "prompts": self.prompts, "outputs": self.outputs,
                "logprobs": self.logprobs, "seeds": self.seeds, "temperature": self.temperature,
                "stage_proofs": [[p.hex() for p in stage] for stage in self.stage_proofs],
                "policy": self.policy.header()}  # fmt: skip

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> GroupBundle:
        return cls(list(header["members"]), header["prompts"], header["outputs"], header["logprobs"],
                   header["seeds"], float(header["temperature"]),
                   [[bytes.fromhex(p) for p in stage] for stage in header["stage_proofs"]],
                   Policy.from_header(header["policy"]))  # fmt: skip


@dataclass
class StageOutput:
    """What one member made of one batch: its proofs, and (stage 0 and the last) the tokens."""

    index: int
    layers: tuple[int, int]
    proofs: list[bytes]
    tokens: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)
    seconds: float = 0.0
    proof_seconds: float = 0.0  # of `seconds`: building its proofs and checking the sender's
    bytes_sent: int = 0
    bundle: GroupBundle | None = None
    batch: int = 1


class Member:
    """Runs `stage` in a group over `link`. `cheat` (tests and the demo only) makes it dishonest."""

    def __init__(self, stage: Stage, link: MemberLink | None, eos_token_id: int, pad_token_id: int,
                 cheat: Cheat = "none", address: str = "",
                 on_policy: Callable[[Policy], Stage] | None = None) -> None:  # fmt: skip
        self.stage, self.link = stage, link
        # A follower told of a batch's policy (step-0 header) gets its stage for it from here (the task
        # loads that checkpoint's layers); None: the stage it has serves every batch.
        self.on_policy = on_policy
        self.policy = Policy()
        self.address = address  # this member's node address, named in the bundle
        self.members: list[str] = []  # every member's address, stage order (`introduce`)
        self._batch = 1
        self.eos, self.pad = eos_token_id, pad_token_id
        self.cheat = cheat
        self.plan = stage.plan
        self._proof_seconds = 0.0
        if cheat == "weights":
            perturb_stage(stage)

    def introduce(self) -> list[str]:
        """Before the first batch: a `hello` frame goes once round the ring, each member adding its node
        address, and comes back to stage 0, which then names the whole list in every batch (the
        batch's seeds derive from it, so a file cannot be re-signed by a node outside the group)."""
        if self.link is None:
            self.members = [self.address]
            return self.members
        if self.plan.first:
            self.link.send({"kind": "hello", "members": [self.address]})
            frame = self.link.recv("hello")
        else:
            frame = self.link.recv("hello")
        members = frame.header.get("members")
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise MemberMisbehaved(self.link.prev, "a hello frame without the members' addresses")
        if self.plan.first:
            if len(members) != self.plan.members or members[0] != self.address:
                raise MemberMisbehaved(self.link.prev, f"a hello round naming {len(members)} members")
        else:
            if len(members) != self.plan.index:
                raise MemberMisbehaved(self.link.prev, f"a hello naming {len(members)} members before stage "
                                                       f"{self.plan.index}")  # fmt: skip
            members = [*members, self.address]
            self.link.send({"kind": "hello", "members": members})
        self.members = members
        return members

    def run_batch(self, request: BatchRequest | None = None) -> StageOutput:
        started = time.perf_counter()
        self._proof_seconds = 0.0
        if self.plan.first:
            if request is None:
                raise ValueError("stage 0 drives the batch: it needs the request")
            self._batch = request.batch
            out = self._drive(request)
        else:
            out = self._follow()
        out.seconds = time.perf_counter() - started
        out.proof_seconds = self._proof_seconds
        out.bytes_sent = self.link.bytes_sent if self.link else 0
        return out

    # ---- stage 0 ------------------------------------------------------------------------------

    def _drive(self, req: BatchRequest) -> StageOutput:
        batch, width = len(req.prompts), max(map(len, req.prompts))
        ids = torch.full((batch, width), self.pad, dtype=torch.long)
        for i, p in enumerate(req.prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
        lengths = [len(p) for p in req.prompts]
        shape: dict[str, Any] = {
            "lengths": lengths, "seeds": list(req.seeds), "max_new_tokens": req.max_new_tokens,
            "temperature": req.temperature, "prompts": [list(p) for p in req.prompts],
            "members": self.members or [self.address], "batch": req.batch, "policy": req.policy.header(),
        }  # fmt: skip
        self.policy = req.policy
        mask, pos = _mask_positions(lengths, width)
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        done = [False] * batch
        sent = _Sent(lengths, width)
        cache: Any = None
        x = ids
        for step in range(req.max_new_tokens):
            out, cache = self._forward(x, mask, pos, cache)
            if self.plan.last:  # a group of one
                sent.add(step, out)
                tok, lp = self._sample(out[:, -1], req.seeds, step, req.temperature)
            else:
                payload = self._tamper(out)
                sent.add(step, payload if self.cheat != "noise-unproven" else out)
                assert self.link is not None
                self.link.send({"kind": "act", "step": step, **(shape if step == 0 else {})}, payload)
                frame = self.link.recv("tok")
                if frame.header["kind"] == "end" or frame.header.get("step") != step:
                    raise MemberMisbehaved(
                        self.link.prev, f"tokens of step {frame.header.get('step')} at {step}"
                    )
                tok = torch.tensor(frame.header["tokens"], dtype=torch.long)
                lp = torch.tensor(frame.header["logprobs"], dtype=torch.float32)
                if tok.shape != (batch,) or lp.shape != (batch,):
                    raise MemberMisbehaved(self.link.prev, f"{tuple(tok.shape)} tokens for {batch} rows")
            for i in range(batch):
                if not done[i]:
                    tokens[i].append(int(tok[i]))
                    logprobs[i].append(float(lp[i]))
                    done[i] = int(tok[i]) == self.eos
            if all(done) or step == req.max_new_tokens - 1:
                break
            x = torch.where(torch.tensor(done), torch.tensor(self.pad), tok).view(-1, 1)
            mask, pos = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype)], dim=1), pos[:, -1:] + 1
        out_lengths = [len(t) for t in tokens]
        if self.plan.last:
            proofs = self._prove(sent.final(out_lengths)) if sent.rows else []
            bundle = GroupBundle(self.members or [self.address], [list(p) for p in req.prompts],
                                 tokens, logprobs, list(req.seeds), req.temperature, [proofs],
                                 req.policy)  # fmt: skip
        else:
            assert self.link is not None
            proofs = self._prove(sent.rows_for(out_lengths))
            self.link.send({"kind": "end", "lengths": out_lengths})
            self.link.send({"kind": "proofs", "proofs": [p.hex() for p in proofs], "earlier": []})
            bundle = self._take_bundle(proofs, tokens)
        return self._output(proofs, tokens, logprobs, bundle)

    # ---- stages 1..n-1 ------------------------------------------------------------------------

    def _follow(self) -> StageOutput:
        assert self.link is not None
        link = self.link
        first = link.recv("act")
        if first.header["kind"] != "act" or first.header.get("step") != 0 or first.tensor is None:
            raise MemberMisbehaved(link.prev, "a batch must start with step 0's activations")
        try:
            shape = {k: first.header[k] for k in ("lengths", "seeds", "max_new_tokens", "temperature",
                                                   "prompts", "members", "batch", "policy")}  # fmt: skip
            policy = Policy.from_header(shape["policy"])
        except KeyError as exc:
            raise MemberMisbehaved(link.prev, f"a step-0 header without {exc}") from None
        except ValueError as exc:
            raise MemberMisbehaved(link.prev, f"a step-0 header with {exc}") from None
        if self.on_policy is not None and policy.weights != self.policy.weights:
            self.stage = self.on_policy(policy)  # that checkpoint's layers, before the batch's first step
            if self.cheat == "weights":
                perturb_stage(self.stage)
        self.policy = policy
        lengths, seeds = list(shape["lengths"]), list(shape["seeds"])
        prompts, members = shape["prompts"], list(shape["members"])
        if not isinstance(shape["batch"], int) or shape["batch"] < 1:
            raise MemberMisbehaved(link.prev, f"a step-0 header with batch {shape['batch']!r}")
        self._batch = shape["batch"]
        if (not isinstance(prompts, list) or [len(p) for p in prompts] != lengths
                or len(members) != self.plan.members or members[self.plan.index] != self.address):
            raise MemberMisbehaved(link.prev, "a step-0 header whose prompts or members do not fit the batch")
        batch, width = len(lengths), int(first.tensor.shape[1])
        if first.tensor.shape != (batch, width, self.stage.hidden_size) or len(seeds) != batch:
            raise MemberMisbehaved(link.prev, f"activations of shape {tuple(first.tensor.shape)}")
        mask, pos = _mask_positions(lengths, width)
        received, sent = _Sent(lengths, width), _Sent(lengths, width)
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        done = [False] * batch
        cache: Any = None
        frame, step = first, 0
        while frame.header["kind"] == "act":
            x = frame.tensor
            if frame.header.get("step") != step or x is None or x.shape[0] != batch:
                raise MemberMisbehaved(
                    link.prev, f"activations of step {frame.header.get('step')} at step {step}"
                )
            received.add(step, x)
            out, cache = self._forward(x, mask, pos, cache)
            if self.plan.last:
                sent.add(step, out)
                tok, lp = self._sample(out[:, -1], seeds, step, float(shape["temperature"]))
                for i in range(batch):
                    if not done[i]:
                        tokens[i].append(int(tok[i]))
                        logprobs[i].append(float(lp[i]))
                        done[i] = int(tok[i]) == self.eos
                link.send({"kind": "tok", "step": step, "tokens": tok.tolist(), "logprobs": lp.tolist()})
            else:
                payload = self._tamper(out)
                sent.add(step, payload if self.cheat != "noise-unproven" else out)
                link.send({"kind": "act", "step": step, **(shape if step == 0 else {})}, payload)
            frame = link.recv("act")
            step += 1
            mask, pos = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype)], dim=1), pos[:, -1:] + 1
        out_lengths = list(frame.header.get("lengths") or [])
        if len(out_lengths) != batch or not all(isinstance(n, int) and 1 <= n <= step for n in out_lengths):
            raise MemberMisbehaved(link.prev, f"an end frame with lengths {out_lengths[:8]}")
        claimed = link.recv("proofs")
        try:
            theirs = [bytes.fromhex(p) for p in claimed.header.get("proofs", [])]
            earlier = [[bytes.fromhex(p) for p in stage] for stage in claimed.header.get("earlier", [])]
        except (TypeError, ValueError):
            raise MemberMisbehaved(link.prev, "a proofs frame that is not hex") from None
        if theirs != self._prove(received.rows_for(out_lengths)):
            raise MemberMisbehaved(link.prev, "its proofs are not those of the activations it sent")
        if len(earlier) != self.plan.index - 1:
            raise MemberMisbehaved(link.prev, f"proofs of {len(earlier)} earlier stages at {self.plan.index}")
        if self.plan.last:
            proofs = self._prove(sent.final(out_lengths))
            bundle = GroupBundle(shape["members"], [list(p) for p in prompts], tokens, logprobs, seeds,
                                 float(shape["temperature"]), [*earlier, theirs, proofs], policy)  # fmt: skip
            link.send(bundle.header())
        else:
            proofs = self._prove(sent.rows_for(out_lengths))
            link.send({"kind": "end", "lengths": out_lengths})
            link.send({"kind": "proofs", "proofs": [p.hex() for p in proofs],
                       "earlier": [[p.hex() for p in stage] for stage in [*earlier, theirs]]})  # fmt: skip
            bundle = self._take_bundle(proofs, None, [*earlier, theirs])
        return self._output(proofs, tokens, logprobs, bundle)

    def _output(self, proofs: list[bytes], tokens: list[list[int]], logprobs: list[list[float]],
                bundle: GroupBundle) -> StageOutput:  # fmt: skip
        finished = [bool(t and t[-1] == self.eos) for t in tokens]
        layers = (self.plan.layers.start, self.plan.layers.stop)
        return StageOutput(self.plan.index, layers, proofs, tokens, logprobs, finished, bundle=bundle,
                           batch=self._batch)

    def _take_bundle(self, proofs: list[bytes], tokens: list[list[int]] | None,
                     before: list[list[bytes]] | None = None) -> GroupBundle:  # fmt: skip
        """A non-last member: the batch's bundle, come round the ring from the last member. It must hold
        this member's own proofs (and, at stage 0, its tokens and address) and the earlier stages'
        proofs as they reached it (`before`): otherwise a last member colluding with an earlier liar
        could hand this member a bundle where the liar's proofs look honest, and the replay would
        blame this member for what it was fed. Members before the last but one pass it on."""
        assert self.link is not None
        frame = self.link.recv("bundle")
        try:
            bundle = GroupBundle.from_header(frame.header)
        except (KeyError, TypeError, ValueError):
            raise MemberMisbehaved(self.link.prev, "a bundle frame that does not parse") from None
        index = self.plan.index
        if (len(bundle.stage_proofs) != self.plan.members or bundle.stage_proofs[index] != proofs
                or len(bundle.members) != self.plan.members or bundle.members[index] != self.address
                or (tokens is not None and bundle.outputs != tokens) or bundle.policy != self.policy
                or (before is not None and bundle.stage_proofs[:index] != before)):
            raise MemberMisbehaved(self.link.prev, "a bundle that misstates this member's part of the batch")
        if index + 2 < self.plan.members:
            self.link.send(bundle.header())
        return bundle

    def _prove(self, hiddens: list[torch.Tensor]) -> list[bytes]:
        t0 = time.perf_counter()
        try:
            return _build_proofs(hiddens)
        finally:
            self._proof_seconds += time.perf_counter() - t0

    # ---- sampling and cheats -------------------------------------------------------------------

    def _forward(
        self, x: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any
    ) -> tuple[torch.Tensor, Any]:
        out, cache = self.stage.forward(x, mask, pos, cache)
        if self.cheat == "skip":  # its layers skipped: what came in goes out (embedded / normed)
            decoder = self.stage.model.model
            with torch.inference_mode():
                if self.plan.first:
                    out = decoder.embed_tokens(x)
                elif self.plan.last:
                    out = decoder.norm(x)
                else:
                    out = x
        return out, cache

    def _sample(self, hidden_last: torch.Tensor, seeds: list[int], step: int, temperature: float
                ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        logits = self.stage.logits(hidden_last)
        if self.cheat == "forge-token":  # greedy instead of the seed's Gumbel draw
            tok = logits.float().argmax(dim=-1)
            return tok, sampler.token_logprobs(logits, tok, temperature)
        return sampler.sample(logits, seeds, [step] * len(seeds), temperature)

    def _tamper(self, out: torch.Tensor) -> torch.Tensor:
        """What a dishonest non-last member forwards instead of its output."""
        if self.cheat in ("noise", "noise-unproven"):
            g = torch.Generator().manual_seed(7)
            return (out.float() + torch.randn(out.shape, generator=g) * 0.05 * out.float().std()).to(
                out.dtype
            )
        if self.cheat == "other-prompt" and out.shape[0] > 1:
            return out.roll(1, dims=0)
        return out


class _Sent:
    """Activations one side of a link saw, kept per row at the positions proofs commit to."""

    def __init__(self, lengths: list[int], width: int) -> None:
        self.lengths, self.width = lengths, width
        self.prompt: torch.Tensor | None = None  # [B, W, H] of step 0
        self.steps: list[torch.Tensor] = []  # [B, H] of steps 1..

    @property
    def rows(self) -> bool:
        return self.prompt is not None

    def add(self, step: int, tensor: torch.Tensor) -> None:
        if step == 0:
            self.prompt = tensor.detach().clone()
        else:
            self.steps.append(tensor[:, -1].detach().clone())

    def _decode(self, i: int, count: int) -> torch.Tensor:
        assert self.prompt is not None
        if count <= 0:
            return self.prompt.new_zeros((0, self.prompt.shape[-1]))
        return torch.stack([s[i] for s in self.steps[:count]])

    def rows_for(self, out_lengths: list[int]) -> list[torch.Tensor]:
        """Per row: every real prompt position, then the positions of its fed output tokens."""
        assert self.prompt is not None
        return [torch.cat([self.prompt[i, self.width - n :], self._decode(i, m - 1)])
                for i, (n, m) in enumerate(zip(self.lengths, out_lengths, strict=True))]  # fmt: skip

    def final(self, out_lengths: list[int]) -> list[torch.Tensor]:
        """Per row: the decode positions only (a single node's TOPLOC proof)."""
        return [self._decode(i, m - 1) for i, m in enumerate(out_lengths)]


def _mask_positions(lengths: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, width - n :] = 1
    return mask, (mask.cumsum(-1) - 1).clamp_min(0)


def perturb_stage(stage: Stage, scale: float = 1e-2, seed: int = 3) -> None:
    """N(0, scale) on one matrix of the member's own layers."""
    weight = next(p for n, p in stage.model.named_parameters() if n.endswith("q_proj.weight"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight.add_((torch.randn(weight.shape, generator=g) * scale).to(weight.dtype))
