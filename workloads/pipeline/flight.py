"""Several batches in flight on one group's links: while one batch's frames cross the wire, every member
works on another's.

Why: a group decodes one token per row per trip round the ring. Over links of tens of milliseconds the
trip is almost all wire, and a member that waits for its one batch's next step idles. With several
whole batches in flight the members take turns: member k runs batch A's step while batch B's
activations travel to it and batch C's tokens travel back to the driver. Each batch keeps exactly the
shapes it has alone (no batch is split or merged), so its tokens, logprobs, proofs and the frames its
seals commit to are byte for byte those of the batch run alone (`tests/pipeline/test_flight.py`).

How: each batch at a member is a generator (`member.py`: `_drive`, `_follow`) that runs its part until
it needs the next frame, says which kind (`Want`), and is resumed with it. `Flight` keeps the batches
waiting by route (the 8-byte batch number every frame travels behind, `transport.py`) and hands each
arriving frame to its batch; a follower opens a batch when a new route arrives. ZeroMQ keeps one link's
frames in order, so within a batch the protocol is what it was, frame for frame.

Bounds: a follower keeps at most `MAX_IN_FLIGHT` batches open, and a route must be new (greater than
every route it has seen): a predecessor cannot make it hold unbounded state, nor reopen a finished batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

from workloads.pipeline.bundle import Policy, StageOutput
from workloads.pipeline.stages import Stage
from workloads.pipeline.transport import RING, Frame, LinkLog, MemberLink, MemberMisbehaved

MAX_IN_FLIGHT = 64


@dataclass(frozen=True)
class Want:
    """What a batch waits for: a frame of `kind` (or `end`), kept in its log unless `log` is False."""

    kind: str
    log: bool = True


@dataclass
class InFlight:
    """One batch at one member: its route, the weights it runs with, what crossed its links."""

    route: int
    stage: Stage
    policy: Policy
    number: int = 1  # its number in the task (the step-0 header's `batch`)
    sent: LinkLog = field(default_factory=LinkLog)
    received: LinkLog = field(default_factory=LinkLog)
    bytes_sent: int = 0
    proof_seconds: float = 0.0
    trips: int = 0  # trips round the ring (the prompts' one, then one per step or per drafted run of steps)
    started: float = field(default_factory=time.time)  # wall clock: comparable across members
    clock: float = field(default_factory=time.perf_counter)


Steps = Generator[Want, Frame, StageOutput]


class Closed(Exception):
    """The driver closed the ring: no batch comes after those in flight."""


class Flight:
    """The batches in flight at one member, by route."""

    def __init__(self, link: MemberLink | None) -> None:
        self.link = link
        self.waiting: dict[int, tuple[InFlight, Steps, Want]] = {}
        self.newest = RING  # the highest route opened here

    def start(self, batch: InFlight, steps: Steps) -> StageOutput | None:
        """Run a batch this member opens (the driver's) until it waits for a frame: None; or, in a group
        of one, to its end: what it made."""
        self.newest = max(self.newest, batch.route)
        return self._advance(batch, steps, None)

    def deliver(self, open_batch: Callable[[int], tuple[InFlight, Steps]] | None) -> StageOutput | None:
        """Take the next frame off the inbox and run its batch until it waits again: None; or to its end:
        what it made. `open_batch` opens a batch for a new route (a follower); None: only batches
        already in flight may be named (the driver). Raises `Closed` at the driver's close frame."""
        assert self.link is not None
        link = self.link
        route, parts = link.recv_routed()
        if route == RING:
            if link.parse(parts, "close").header.get("kind") != "close":
                raise MemberMisbehaved(link.prev, "an end frame outside any batch")
            raise Closed
        entry = self.waiting.get(route)
        if entry is None:
            if open_batch is None or route <= self.newest:
                raise MemberMisbehaved(link.prev, f"a frame for batch route {route}, which is not in flight")
            if len(self.waiting) >= MAX_IN_FLIGHT:
                raise MemberMisbehaved(link.prev, f"over {MAX_IN_FLIGHT} batches open at once")
            self.newest = route
            batch, steps = open_batch(route)
            entry = (batch, steps, next(steps))
        batch, steps, want = entry
        frame = link.parse(parts, want.kind)
        if want.log:
            batch.received.add(parts)
        return self._advance(batch, steps, frame)

    def _advance(self, batch: InFlight, steps: Steps, frame: Frame | None) -> StageOutput | None:
        try:
            want = next(steps) if frame is None else steps.send(frame)
        except StopIteration as done:
            self.waiting.pop(batch.route, None)
            out: StageOutput = done.value
            out.seconds = time.perf_counter() - batch.clock
            out.started = batch.started
            out.proof_seconds = batch.proof_seconds
            out.bytes_sent = batch.bytes_sent
            out.trips = batch.trips
            out.received_frames = batch.received.frames
            out.sent_frames = batch.sent.frames
            return out
        self.waiting[batch.route] = (batch, steps, want)
        return None
