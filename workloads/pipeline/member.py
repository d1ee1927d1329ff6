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

Batches in flight (`flight.py`): `serve` keeps up to `in_flight` batches moving at once, each a
generator of this protocol waiting on its own route; `run_batch` is one batch alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

import torch

from workloads.model import sampler
from workloads.pipeline import inbound
from workloads.pipeline.bundle import BatchRequest, GroupBundle, Policy, StageOutput
from workloads.pipeline.cheats import change_stage, tamper
from workloads.pipeline.commit import LinkSigner, shape_claim, signed_by
from workloads.pipeline.draft import MAX_DRAFT_TOKENS, Draft
from workloads.pipeline.flight import Closed, Flight, InFlight, Steps, Want
from workloads.pipeline.options import Cheat
from workloads.pipeline.positions import SeenRows, grow, mask_positions
from workloads.pipeline.seals import Sealing
from workloads.pipeline.selfcheck import SelfCheck, SelfLimits
from workloads.pipeline.stages import Stage
from workloads.pipeline.transport import Frame, MemberLink, MemberMisbehaved
from workloads.pipeline.trips import Rows, Trip, act_frame, cut, draft_inputs, end_frame, kept, tok_frame
from workloads.toploc.proof import build_proofs_batch as _build_proofs

__all__ = ["BatchRequest", "GroupBundle", "Member", "Policy", "StageOutput"]


class Member(Sealing):
    """Runs `stage` in a group over `link`. `cheat` (tests and the demo only) makes it dishonest."""

    def __init__(self, stage: Stage, link: MemberLink | None, eos_token_id: int, pad_token_id: int,
                 cheat: Cheat = "none", address: str = "",
                 on_policy: Callable[[Policy], Stage] | None = None, signer: LinkSigner | None = None,
                 task_id: str = "local", group_id: str = "local", draft: Draft | None = None,
                 draft_tokens: int = 0, self_limits: SelfLimits | None = None,
                 admit: Callable[[dict[str, Any]], list[str]] | None = None,
                 expected: list[str] | None = None) -> None:  # fmt: skip
        if not 0 <= draft_tokens <= MAX_DRAFT_TOKENS:
            raise ValueError(f"draft_tokens {draft_tokens}: between 0 and {MAX_DRAFT_TOKENS}")
        self.stage, self.link = stage, link
        # The driver's draft (`draft.py`), guessing up to `draft_tokens` tokens a trip round the ring; every
        # member refuses a trip wider than the task allows (a driver cannot make it run unasked positions).
        self.draft, self.draft_tokens = draft, draft_tokens
        # Signs this member's link claims with its node key; None: nothing signed, and no seal checked
        # (a local group of tests without keys: its files then prove nobody's fault).
        self.signer = signer
        self.task_id, self.group_id = task_id, group_id
        # A follower told of a batch's policy (step-0 header) gets its stage for it from here (the task
        # loads that checkpoint's layers); None: the stage it has serves every batch.
        self.on_policy = on_policy
        self.policy = Policy()  # the newest batch's; each batch in flight keeps its own (`InFlight`)
        self.address = address  # this member's node address, named in the bundle
        self.members: list[str] = []  # every member's address, stage order (`introduce`)
        self._route = 0  # the driver's last batch route
        self.busy = 0  # the driver's batches in flight when it asks for the next request
        self.eos, self.pad = eos_token_id, pad_token_id
        self.cheat = cheat
        self.plan = stage.plan
        # Before a batch ends here, this member judges its own file as a validator would (`selfcheck.py`);
        # a cheat of the tests and the demo writes its file regardless, as a dishonest member would.
        self.checker = SelfCheck(self_limits) if cheat == "none" else None
        # A follower holds a batch's step-0 shape to the task's plan before it runs it (`workload.py`: prompts
        # and seeds derived from task, group, members and number; the task's limits), so a lie there is
        # named on whoever sent it, not on the driver nor on a member after the liar.
        self.admit = admit
        # Every member's node address as the orchestrator formed the group (None: the hello round's word):
        # the hello round and the driver's signature on each batch are held to it.
        self.expected = expected or None
        change_stage(cheat, stage)  # its layers as a stage-level cheat runs them (cheats.py); else a no-op

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
        if self.expected is not None and members != self.expected[: len(members)]:
            raise MemberMisbehaved(self.link.prev, "a hello naming other members than the group's")
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
        """One batch, alone: stage 0 drives `request`, a follower serves the next batch that arrives."""
        if self.plan.first and request is None:
            raise ValueError("stage 0 drives the batch: it needs the request")
        return next(self.serve([request] if request is not None else None, batches=1))

    def serve(self, requests: Iterable[BatchRequest | None] | None = None, *, in_flight: int = 1,
              batches: int | None = None, close: bool = False) -> Iterator[StageOutput]:  # fmt: skip
        """What this member made of each batch, as each ends (not always in order). Stage 0 drives
        `requests` (taken one at a time, as a slot frees; a None there: nothing to start yet, asked
        again once a batch in flight has moved), keeping up to `in_flight` in flight, and with `close`
        tells the ring there are no more; a follower serves whatever batches arrive, until
        `batches` have ended or the driver closes the ring."""
        if self.plan.first and requests is None:
            raise ValueError("stage 0 drives the batches: it needs the requests")
        if not 1 <= in_flight <= 64:
            raise ValueError(f"in_flight {in_flight}: between 1 and 64 batches")
        flight = Flight(self.link)
        pending = iter(requests) if self.plan.first and requests is not None else None
        made = 0
        while True:
            while pending is not None and len(flight.waiting) < in_flight:
                self.busy = len(flight.waiting)
                try:
                    request = next(pending)
                except StopIteration:
                    pending = None
                    break
                if request is None:  # nothing to start yet: asked again once a batch in flight has moved
                    if not flight.waiting:
                        raise RuntimeError("the driver's requests paused with no batch in flight")
                    break
                self._route += 1
                batch = InFlight(self._route, self.stage, request.policy, request.batch)
                self.policy = request.policy
                out = flight.start(batch, self._drive(batch, request))
                if out is not None:  # a group of one
                    made += 1
                    yield out
            if not flight.waiting and (pending is None if self.plan.first
                                       else batches is not None and made >= batches):  # fmt: skip
                break
            try:
                out = flight.deliver(None if self.plan.first else self._open_following)
            except Closed:
                if self.plan.first:
                    raise MemberMisbehaved(self._link.prev, "a close frame at the driver") from None
                if not self.plan.last:
                    self._link.send({"kind": "close"})
                return
            if out is not None:
                made += 1
                yield out
        if close and self.link is not None and self.plan.first:
            self.link.send({"kind": "close"})

    @property
    def _link(self) -> MemberLink:
        if self.link is None:
            raise RuntimeError("a group of one has no link")
        return self.link

    def _open_following(self, route: int) -> tuple[InFlight, Steps]:
        batch = InFlight(route, self.stage, self.policy)
        return batch, self._follow(batch)

    def _send(self, batch: InFlight, header: dict[str, Any], tensor: torch.Tensor | None = None, *,
              log: bool = True) -> None:  # fmt: skip
        kept = batch.sent if log else None
        batch.bytes_sent += self._link.send(header, tensor, route=batch.route, log=kept)

    # ---- stage 0 ------------------------------------------------------------------------------

    def _drive(self, b: InFlight, req: BatchRequest) -> Steps:
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
        claim = shape_claim(self.task_id, self.group_id, req.batch, shape)
        shape["signature"] = self.signer.sign(claim) if self.signer is not None else ""
        mask, pos = mask_positions(lengths, width)
        rows, sent, limit = Rows(batch, self.eos), SeenRows(lengths, width), req.max_new_tokens
        out, cache = self._forward(b, ids, mask, pos, None)  # step 0: the prompts
        b.trips += 1
        if self.plan.last:  # a group of one
            return self._alone(b, req, rows, sent, out, cache, mask, pos)
        payload = self._tamper(out)
        sent.add(0, payload if self.cheat != "noise-unproven" else out)
        self._send(b, {"kind": "act", "step": 0, **shape}, payload)
        frame = yield Want("tok", log=False)
        last, lp = self._trip_tokens(frame, 0, 1, batch)[0]
        b.received.add(tok_frame(0, last.tolist(), lp.tolist()))
        rows.take(last, lp)
        step, keep = 1, 1
        while not rows.finished and step < limit:
            wide = self.draft_tokens + (2 if self.cheat == "over-draft" else 0)
            guesses = min(wide, limit - 1 - step) if self.draft else 0  # none past the last step
            contexts = [list(p) + t for p, t in zip(req.prompts, rows.tokens, strict=True)] if guesses else []
            inputs = draft_inputs(last, rows.done, contexts, self.draft, guesses, self.eos, self.pad,
                                  list(req.seeds), step, req.temperature)  # fmt: skip
            trip, cache = self._run_trip(b, step, inputs, mask, pos, cache)
            wire = torch.cat(trip.payloads, dim=1)
            self._send(b, {"kind": "act", "step": step, "keep": keep}, wire, log=False)
            frame = yield Want("tok", log=False)
            sampled = self._trip_tokens(frame, step, trip.positions, batch)
            keep = kept(inputs, [t for t, _ in sampled], rows.done, self.eos, self.pad)
            if self.cheat == "over-keep" and keep < trip.positions:
                keep += 1  # a position whose input was a wrong guess, committed as if right
            count = 0
            for j in range(keep):  # what counts, as plain decoding would have sent and received it
                tok, lp = sampled[j]
                sent.add(step + j, trip.proven[j])
                b.sent.add(trip.sent[j])
                b.received.add(tok_frame(step + j, tok.tolist(), lp.tolist()))
                rows.take(tok, lp)
                count += 1
                if rows.finished or step + j == limit - 1:
                    break
            mask, pos, cache = cut(trip, count, mask, pos, cache)
            keep, step, last = count, step + count, sampled[count - 1][0]
        out_lengths = [len(t) for t in rows.tokens]
        proofs = self._prove(b, sent.rows_for(out_lengths))
        self._send(b, {"kind": "end", "lengths": out_lengths, "keep": keep}, log=False)
        b.sent.add(end_frame(out_lengths))
        self._send(b, {"kind": "proofs", "proofs": [p.hex() for p in proofs], "earlier": []})
        seal = self._seal(b, [])
        bundle = yield from self._take_bundle(b, proofs, rows.tokens, links=[], seal=seal, shape=shape,
                                              lengths=out_lengths)  # fmt: skip
        return self._output(b, proofs, rows.tokens, rows.logprobs, bundle)

    def _alone(self, b: InFlight, req: BatchRequest, rows: Rows, sent: SeenRows, out: torch.Tensor,
               cache: Any, mask: torch.Tensor, pos: torch.Tensor) -> StageOutput:  # fmt: skip
        """A group of one (the driver is the last stage): plain decoding, nobody to send to."""
        step = 0
        while True:
            sent.add(step, out)
            tok, lp = self._sample(b, out[:, -1], req.seeds, step, req.temperature)
            rows.take(tok, lp)
            if rows.finished or step == req.max_new_tokens - 1:
                break
            x = torch.where(torch.tensor(rows.done), torch.tensor(self.pad), tok).view(-1, 1)
            mask, pos = grow(mask, pos)
            step += 1
            b.trips += 1
            out, cache = self._forward(b, x, mask, pos, cache)
        out_lengths = [len(t) for t in rows.tokens]
        proofs = self._prove(b, sent.final(out_lengths))
        bundle = GroupBundle(self.members or [self.address], [list(p) for p in req.prompts], rows.tokens,
                             rows.logprobs, list(req.seeds), req.temperature, [proofs],
                             req.policy)  # fmt: skip
        return self._output(b, proofs, rows.tokens, rows.logprobs, bundle)

    def _run_trip(self, b: InFlight, step: int, x: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
                  cache: Any, seeds: list[int] | None = None,
                  temperature: float = 1.0) -> tuple[Trip, Any]:  # fmt: skip
        """Run a trip's positions (token ids [B, P] at stage 0, activations [B, P, H] after) one at a time,
        with the shapes plain decoding has; what each would count for is kept in the `Trip`."""
        trip = Trip(step)
        b.trips += 1
        for j in range(x.shape[1]):
            mask, pos = grow(mask, pos)
            xj = x[:, j : j + 1].contiguous()
            out, cache = self._forward(b, xj, mask, pos, cache)
            if not self.plan.first:
                trip.inputs.append(xj)
                trip.received.append(act_frame(step + j, xj))
            if self.plan.last:
                assert seeds is not None
                tok, lp = self._sample(b, out[:, -1], seeds, step + j, temperature)
                trip.sampled.append((tok, lp))
                trip.proven.append(out)
                trip.sent.append(tok_frame(step + j, tok.tolist(), lp.tolist()))
            else:
                payload = self._tamper(out)
                trip.payloads.append(payload)
                trip.proven.append(payload if self.cheat != "noise-unproven" else out)
                trip.sent.append(act_frame(step + j, payload))
        return trip, cache

    def _trip_tokens(self, frame: Frame, step: int, positions: int, batch: int
                     ) -> list[tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
        """The last stage's tokens and logprobs of a trip, per position, every field checked."""
        return inbound.tokens(self._link.prev, frame, step, positions, batch, self.stage.vocab_size)

    # ---- stages 1..n-1 ------------------------------------------------------------------------

    def _follow(self, b: InFlight) -> Steps:
        first = yield Want("act")
        shape = self._step0_shape(b, first)
        assert first.tensor is not None
        lengths, width = list(shape["lengths"]), int(first.tensor.shape[1])
        mask, pos = mask_positions(lengths, width)
        received, sent = SeenRows(lengths, width), SeenRows(lengths, width)
        rows = Rows(len(lengths), self.eos)
        received.add(0, first.tensor)
        b.trips += 1
        out, cache = self._forward(b, first.tensor, mask, pos, None)
        if self.plan.last:
            sent.add(0, out)
            tok, lp = self._sample(b, out[:, -1], list(shape["seeds"]), 0, float(shape["temperature"]))
            rows.take(tok, lp)
            self._send(b, {"kind": "tok", "step": 0, "tokens": [tok.tolist()], "logprobs": [lp.tolist()]},
                       log=False)  # fmt: skip
            b.sent.add(tok_frame(0, tok.tolist(), lp.tolist()))
        else:
            payload = self._tamper(out)
            sent.add(0, payload if self.cheat != "noise-unproven" else out)
            self._send(b, {"kind": "act", "step": 0, **shape}, payload)
        end, step, keep = yield from self._follow_trips(b, shape, received, sent, rows, mask, pos, cache)
        return (yield from self._follow_end(b, shape, end, step, keep, received, sent, rows))

    def _step0_shape(self, b: InFlight, first: Frame) -> dict[str, Any]:
        """Step 0's header, held to all a follower knows before it runs the batch: well formed, its policy
        (whose layers this member then loads), the members in their places, the driver's signature and
        the task's plan (`admit`). A lie there is named on whoever sent it."""
        prev = self._link.prev
        if first.header["kind"] != "act" or first.header.get("step") != 0:
            raise MemberMisbehaved(prev, "a batch must start with step 0's activations")
        stage = b.stage
        shape = inbound.step0_shape(prev, first, stage.hidden_size, stage.vocab_size, stage.model.dtype)
        try:
            policy = Policy.from_header(shape["policy"])
        except ValueError as exc:
            raise MemberMisbehaved(prev, f"a step-0 header with {exc}") from None
        if self.on_policy is not None and policy.weights != self.policy.weights:
            self.stage = self.on_policy(policy)  # that checkpoint's layers, before the batch's first step
            change_stage(self.cheat, self.stage)
        self.policy = b.policy = policy
        b.stage = self.stage
        members = list(shape["members"])
        b.number = shape["batch"]
        if len(members) != self.plan.members or members[self.plan.index] != self.address:
            raise MemberMisbehaved(prev, "a step-0 header whose members do not fit the batch")
        # Step 0's shape is the driver's own word (signed by the group's first member, as the orchestrator
        # or else the hello round named it) and names the members the hello round did.
        if self.members and members[: len(self.members)] != self.members:
            raise MemberMisbehaved(prev, "a step-0 header naming other members than the hello round")
        driver = (self.expected or self.members or members)[0]
        claim = shape_claim(self.task_id, self.group_id, shape["batch"], shape)
        if self.signer is not None and not signed_by(claim, shape["signature"], driver):
            raise MemberMisbehaved(prev, f"a step-0 shape the driver ({driver}) did not sign")
        problems = self.admit(shape) if self.admit is not None else []
        if problems:
            raise MemberMisbehaved(prev, f"a batch that is not the task's: {'; '.join(problems[:2])}")
        return shape

    def _follow_trips(self, b: InFlight, shape: dict[str, Any], received: SeenRows, sent: SeenRows,
                      rows: Rows, mask: torch.Tensor, pos: torch.Tensor, cache: Any
                      ) -> Generator[Want, Frame, tuple[Frame, int, int]]:  # fmt: skip
        """Every trip after step 0, until the driver's `end`: each frame says how many of the last trip's
        positions count (`keep`), which are committed as plain decoding would have received and sent
        them, then the trip it carries is run and passed on. Returns the `end` frame, the step reached
        and the last `keep`."""
        prev, batch, limit = self._link.prev, len(shape["lengths"]), shape["max_new_tokens"]
        seeds, temperature = list(shape["seeds"]), float(shape["temperature"])
        trip: Trip | None = None
        step = 1
        while True:
            frame = yield Want("act", log=False)
            keep, positions = frame.header.get("keep"), trip.positions if trip else 1
            if not isinstance(keep, int) or not 1 <= keep <= positions:
                raise MemberMisbehaved(prev, f"a frame keeping {keep!r} of the last trip's {positions}")
            if trip is not None:  # commit what counts, as plain decoding would have received and sent it
                for j in range(keep):
                    received.add(trip.step + j, trip.inputs[j])
                    b.received.add(trip.received[j])
                    sent.add(trip.step + j, trip.proven[j])
                    b.sent.add(trip.sent[j])
                    if self.plan.last:
                        rows.take(*trip.sampled[j])
                mask, pos, cache = cut(trip, keep, mask, pos, cache)
                step = trip.step + keep
            if frame.header["kind"] == "end":
                return frame, step, keep
            most = min(self.draft_tokens + 1, limit - step)  # positions a trip may carry from here
            x = inbound.trip(prev, frame, step, batch, most, b.stage.hidden_size, b.stage.model.dtype)
            trip, cache = self._run_trip(b, step, x, mask, pos, cache, seeds, temperature)
            if self.plan.last:
                self._send(b, {"kind": "tok", "step": step, "tokens": [t.tolist() for t, _ in trip.sampled],
                               "logprobs": [p.tolist() for _, p in trip.sampled]}, log=False)  # fmt: skip
            else:
                self._send(b, {"kind": "act", "step": step, "keep": keep}, torch.cat(trip.payloads, dim=1),
                           log=False)  # fmt: skip

    def _follow_end(self, b: InFlight, shape: dict[str, Any], end: Frame, step: int, keep: int,
                    received: SeenRows, sent: SeenRows, rows: Rows) -> Steps:  # fmt: skip
        """After `end`: the predecessor's proofs checked against what this member received, its seal
        countersigned; then the last member sends the bundle round the ring, any other passes its own
        proofs and seal on and takes the bundle when it comes back."""
        prev, batch = self._link.prev, len(shape["lengths"])
        own = [len(t) for t in rows.tokens] if self.plan.last else None  # the last stage counts them itself
        out_lengths = inbound.end_lengths(prev, end, batch, step, own)
        b.received.add(end_frame(out_lengths))
        claimed = yield Want("proofs")
        theirs, earlier = inbound.proofs(prev, claimed, batch, self.plan.index - 1)
        if theirs != self._prove(b, received.rows_for(out_lengths)):
            raise MemberMisbehaved(prev, "its proofs are not those of the activations it sent")
        links = yield from self._countersign(b, list(shape["members"]))
        if self.plan.last:
            proofs = self._prove(b, sent.final(out_lengths))
            bundle = GroupBundle(shape["members"], [list(p) for p in shape["prompts"]], rows.tokens,
                                 rows.logprobs, list(shape["seeds"]), float(shape["temperature"]),
                                 [*earlier, theirs, proofs], b.policy, links)  # fmt: skip
            self._send(b, bundle.header(), log=False)
        else:
            proofs = self._prove(b, sent.rows_for(out_lengths))
            self._send(b, {"kind": "end", "lengths": out_lengths, "keep": keep}, log=False)
            b.sent.add(end_frame(out_lengths))
            passed_on = [[p.hex() for p in stage] for stage in [*earlier, theirs]]
            self._send(b, {"kind": "proofs", "proofs": [p.hex() for p in proofs], "earlier": passed_on})
            seal = self._seal(b, links)
            bundle = yield from self._take_bundle(b, proofs, None, [*earlier, theirs], links=links, seal=seal,
                                                  shape=shape, lengths=out_lengths)  # fmt: skip
        return self._output(b, proofs, rows.tokens, rows.logprobs, bundle)

    def _output(self, b: InFlight, proofs: list[bytes], tokens: list[list[int]], logprobs: list[list[float]],
                bundle: GroupBundle) -> StageOutput:  # fmt: skip
        if self.checker is not None and self.link is not None:
            self.checker.check(b.stage, bundle, b.received.frames, b.sent.frames, task_id=self.task_id,
                               group_id=self.group_id, batch=b.number, eos=self.eos, pad=self.pad,
                               prev=self.link.prev)  # fmt: skip
        finished = [bool(t and t[-1] == self.eos) for t in tokens]
        layers = (self.plan.layers.start, self.plan.layers.stop)
        return StageOutput(self.plan.index, layers, proofs, tokens, logprobs, finished, bundle=bundle,
                           batch=b.number)

    def _prove(self, b: InFlight, hiddens: list[torch.Tensor]) -> list[bytes]:
        t0 = time.perf_counter()
        try:
            return _build_proofs(hiddens)
        finally:
            b.proof_seconds += time.perf_counter() - t0

    # ---- sampling and cheats -------------------------------------------------------------------

    def _forward(
        self, b: InFlight, x: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any
    ) -> tuple[torch.Tensor, Any]:
        out, cache = b.stage.forward(x, mask, pos, cache)
        if self.link is not None:  # never sent nor proven: the batch stops, naming who fed it
            inbound.finite_output(self.link.prev, out)
        if self.cheat == "skip":  # its layers skipped: what came in goes out (embedded / normed)
            decoder = b.stage.model.model
            with torch.inference_mode():
                if self.plan.first:
                    out = decoder.embed_tokens(x)
                elif self.plan.last:
                    out = decoder.norm(x)
                else:
                    out = x
        return out, cache

    def _sample(self, b: InFlight, hidden_last: torch.Tensor, seeds: list[int], step: int, temperature: float
                ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        logits = b.stage.logits(hidden_last)
        if self.cheat == "forge-token":  # greedy instead of the seed's Gumbel draw
            tok = logits.float().argmax(dim=-1)
            return tok, sampler.token_logprobs(logits, tok, temperature)
        return sampler.sample(logits, seeds, [step] * len(seeds), temperature)

    def _tamper(self, out: torch.Tensor) -> torch.Tensor:
        return tamper(self.cheat, out)

