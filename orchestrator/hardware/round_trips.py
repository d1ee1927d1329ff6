"""Round trips between pool members, measured by the members: each pass asks every Healthy node that
can be called to measure up to `MAX_PEERS` other Healthy nodes' peer inboxes (those it measured
longest ago first) and records the figures (`RoundTripBook`). Group formation goes by the links both
ends measured and agree on, none of a node whose reports contradict its peers' (orchestrator/groups/
nearness.py says why), so members that would wait on each other across an ocean are not put together
because they said they were near, and no node picks its neighbours by what it reports.

Cost: one signed request per node per pass and up to 3 × 16 TCP handshakes it makes; with the default
`round_trip_seconds` (300) a node measures 16 peers every 5 minutes, so a pool of N nodes has every
link measured from both ends within about N / 16 × 5 minutes.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable

import structlog
from fastapi.concurrency import run_in_threadpool

from intellect.errors import PeerError
from intellect.wire.hardware import MAX_PEERS, RoundTripReport, RoundTripRequest
from intellect.wire.nodes import NodeState
from orchestrator.context import Context
from orchestrator.groups.reconcile import peer_inbox
from orchestrator.pacing import Pacing

log = structlog.get_logger("intellect.orchestrator.round_trips")
MAX_CONCURRENT = 8


async def round_trip_pass(ctx: Context) -> int:
    """One pass; returns how many nodes reported."""
    rows = await run_in_threadpool(ctx.book.all, [NodeState.HEALTHY])
    inboxes = {r.address: peer_inbox(r) for r in rows}
    inboxes = {a: p for a, p in inboxes.items() if p is not None}
    callers = [r for r in rows if r.worker_url and r.joined_via != "pull" and r.address in inboxes]
    limit = asyncio.Semaphore(MAX_CONCURRENT)
    reported = 0
    measured = await run_in_threadpool(ctx.round_trips.measured_at)

    async def one(address: str, url: str) -> None:
        nonlocal reported
        seen = measured.get(address, {})
        others = sorted((a for a in inboxes if a != address), key=lambda a: (seen.get(a, 0.0), a))[:MAX_PEERS]
        if not others:
            return
        async with limit:
            try:
                response = await ctx.peers.request(
                    "POST", url.rstrip("/") + "/hardware/round-trips",
                    content=RoundTripRequest(peers=[inboxes[a] for a in others]).model_dump_json(),
                    headers={"Content-Type": "application/json"})  # fmt: skip
                report = RoundTripReport.model_validate_json(response.content)
            except (PeerError, ValueError) as exc:
                log.info("round trips not measured", node=address, error=str(exc)[:200])
                return
        if len(report.ms) != len(others):
            log.warning("round trips answered for other peers", node=address)
            return
        figures = {a: ms if ms is None or ms >= 0 else None
                   for a, ms in zip(others, report.ms, strict=True)}  # fmt: skip
        await run_in_threadpool(ctx.round_trips.record, address, figures)
        reported += 1

    await asyncio.gather(*(one(r.address, r.worker_url or "") for r in callers))
    return reported


async def round_trip_loop(ctx: Context, is_leader: Callable[[], Awaitable[bool]]) -> None:
    pacing = Pacing("round-trip pass", ctx.settings.round_trip_seconds)
    for _ in itertools.count():
        started = time.monotonic()
        try:
            if await is_leader():
                await round_trip_pass(ctx)
            pacing.succeeded()
        except Exception:  # a node that hangs up must not end the loop
            pacing.failed()
        await asyncio.sleep(pacing.wait_after(started, time.monotonic()))
