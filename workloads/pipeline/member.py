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

Seals (`commit.py`): after its proofs frame, a non-last member sends a `seal`: the sha256 of every frame
it sent on that link in the batch, signed with its node key, and the link records of the links before
it. The receiver compares the digest with that of the frames it received, checks the signature is
the sender's (the address the hello round named), countersigns, and passes the records on; the last
member puts them in the bundle. Each member keeps the exact frames it received and sent (`StageOutput.
received_frames`, `sent_frames`) for its file, so a validator replays its stage from what it really
received and compares with what it really sent.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import torch

from workloads.model import sampler
from workloads.pipeline.bundle import BatchRequest, GroupBundle, Policy, StageOutput
from workloads.pipeline.cheats import perturb_stage, tamper
from workloads.pipeline.commit import LinkClaim, LinkRecord, LinkSigner, signed_by

__all__ = ["BatchRequest", "GroupBundle", "Member", "Policy", "StageOutput", "perturb_stage"]
from workloads.pipeline.options import Cheat
from workloads.pipeline.stages import Stage
from workloads.pipeline.transport import MemberLink, MemberMisbehaved
from workloads.toploc.proof import build_proofs_batch as _build_proofs


class Member:
    """Runs `stage` in a group over `link`. `cheat` (tests and the demo only) makes it dishonest."""

    def __init__(self, stage: Stage, link: MemberLink | None, eos_token_id: int, pad_token_id: int,
                 cheat: Cheat = "none", address: str = "",
                 on_policy: Callable[[Policy], Stage] | None = None, signer: LinkSigner | None = None,
                 task_id: str = "local", group_id: str = "local") -> None:  # fmt: skip
        self.stage, self.link = stage, link
        # Signs this member's link claims with its node key; None: nothing signed, and no seal checked
        # (a local group of tests without keys: its files then prove nobody's fault).
        self.signer = signer
        self.task_id, self.group_id = task_id, group_id
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
        if self.link is not None:
            self.link.begin_batch()
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
        if self.link is not None:
            out.received_frames = self.link.received_log.frames
            out.sent_frames = self.link.sent_log.frames
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
            seal = self._seal([])
            bundle = self._take_bundle(proofs, tokens, links=[], seal=seal)
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
        links = self._countersign(members)
        if self.plan.last:
            proofs = self._prove(sent.final(out_lengths))
            bundle = GroupBundle(shape["members"], [list(p) for p in prompts], tokens, logprobs, seeds,
                                 float(shape["temperature"]), [*earlier, theirs, proofs], policy,
                                 links)  # fmt: skip
            link.send(bundle.header(), log=False)
        else:
            proofs = self._prove(sent.rows_for(out_lengths))
            link.send({"kind": "end", "lengths": out_lengths})
            link.send({"kind": "proofs", "proofs": [p.hex() for p in proofs],
                       "earlier": [[p.hex() for p in stage] for stage in [*earlier, theirs]]})  # fmt: skip
            seal = self._seal(links)
            bundle = self._take_bundle(proofs, None, [*earlier, theirs], links=links, seal=seal)
        return self._output(proofs, tokens, logprobs, bundle)

    def _output(self, proofs: list[bytes], tokens: list[list[int]], logprobs: list[list[float]],
                bundle: GroupBundle) -> StageOutput:  # fmt: skip
        finished = [bool(t and t[-1] == self.eos) for t in tokens]
        layers = (self.plan.layers.start, self.plan.layers.stop)
        return StageOutput(self.plan.index, layers, proofs, tokens, logprobs, finished, bundle=bundle,
                           batch=self._batch)

    def _claim(self, sender: int, role: str, sha256: str) -> LinkClaim:
        return LinkClaim(self.task_id, self.group_id, self._batch, sender, sender + 1, role, sha256)

    def _seal(self, links: list[LinkRecord]) -> LinkRecord:
        """After this member's proofs frame: the digest of every frame it sent in the batch, signed, with
        the records of the links before it (for the last member's bundle)."""
        assert self.link is not None
        digest = self.link.sent_log.digest()
        signature = self.signer.sign(self._claim(self.plan.index, "sent", digest)) if self.signer else ""
        self.link.send({"kind": "seal", "sha256": digest, "signature": signature,
                        "links": [r.header() for r in links]}, log=False)  # fmt: skip
        return LinkRecord(self.plan.index, digest, signature)

    def _countersign(self, members: list[str]) -> list[LinkRecord]:
        """The predecessor's seal: its digest must be that of the frames received, its signature its node
        key's; countersigned, it joins the records of the links before it."""
        assert self.link is not None
        link, prev = self.link, self.link.prev
        frame = link.recv("seal", log=False)
        digest, signature = frame.header.get("sha256"), frame.header.get("signature")
        records = frame.header.get("links")
        try:
            if not isinstance(records, list):
                raise ValueError("no list of link records")
            earlier = [LinkRecord.from_header(r) for r in records]
        except ValueError as exc:
            raise MemberMisbehaved(prev, f"a seal with {exc}") from None
        if frame.header.get("kind") != "seal" or not (isinstance(digest, str) and isinstance(signature, str)):
            raise MemberMisbehaved(prev, "a batch without its seal (the digest of what it sent, signed)")
        if len(earlier) != prev or [r.sender for r in earlier] != list(range(prev)):
            raise MemberMisbehaved(prev, f"a seal carrying {len(earlier)} link records at link {prev}")
        got = link.received_log.digest()
        if self.cheat == "false-accuse" or digest != got:
            raise MemberMisbehaved(prev, f"its seal says it sent {digest[:12]}…, the frames received hash "
                                         f"to {got[:12]}…")  # fmt: skip
        claim = self._claim(prev, "sent", digest)
        if self.signer is not None and not signed_by(claim, signature, members[prev]):
            raise MemberMisbehaved(prev, f"its seal is not signed by its node key ({members[prev]})")
        if self.cheat == "forge-received":  # countersigns frames it did not receive
            got = hashlib.sha256(got.encode()).hexdigest()
        counter = self.signer.sign(self._claim(prev, "received", got)) if self.signer else ""
        return [*earlier, LinkRecord(prev, digest, signature, got, counter)]

    def _take_bundle(self, proofs: list[bytes], tokens: list[list[int]] | None,
                     before: list[list[bytes]] | None = None, *, links: list[LinkRecord],
                     seal: LinkRecord) -> GroupBundle:  # fmt: skip
        """A non-last member: the batch's bundle, come round the ring from the last member. It must hold
        this member's own proofs (and, at stage 0, its tokens and address) and the earlier stages'
        proofs as they reached it (`before`): otherwise a last member colluding with an earlier liar
        could hand this member a bundle where the liar's proofs look honest, and the replay would
        blame this member for what it was fed. Members before the last but one pass it on."""
        assert self.link is not None
        frame = self.link.recv("bundle", log=False)
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
        mine = bundle.links[index] if len(bundle.links) == self.plan.members - 1 else None
        if (bundle.links[:index] != links or mine is None or mine.sha256 != seal.sha256
                or mine.signature != seal.signature):
            raise MemberMisbehaved(self.link.prev, "a bundle that misstates what this member's links carried")
        if index + 2 < self.plan.members:
            self.link.send(bundle.header(), log=False)
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
        return tamper(self.cheat, out)


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
