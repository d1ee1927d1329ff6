"""Re-challenges at random times: a node proves its hardware before its invite, and then again while it
is in the pool, at moments it cannot foresee (each pass challenges each Healthy node with probability
pass interval / `hardware_recheck_seconds`: exponentially distributed gaps of that mean). A node that
swapped its GPU for a slower one after proving it is placed by the new figure; a wrong answer, or a
commitment not opened, from a pool member is recorded with its evidence (`/nodes/{address}/hardware`),
clears its figure and is logged for the pool owner, who decides on chain (`intellect-pool slashing
hardware`, a validator's vote, for a wrong answer); with `MAX_FAILED` failures on record the node is
not grouped again (orchestrator/groups/reconcile.py), the only move the orchestrator, which holds no
stake, makes.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Awaitable, Callable

import structlog
from fastapi.concurrency import run_in_threadpool

from intellect.wire.nodes import NodeState
from orchestrator.context import Context
from orchestrator.hardware.challenger import challenge_node
from orchestrator.pacing import Pacing

log = structlog.get_logger("intellect.orchestrator.hardware")
MAX_CONCURRENT = 4  # challenges at once: each costs the challenger O(n²) and the node O(n³)


async def recheck_pass(ctx: Context, interval: float, draw: random.Random) -> int:
    """One pass: challenge the Healthy nodes drawn this time; returns how many were challenged."""
    settings = ctx.settings
    chance = min(1.0, interval / settings.hardware_recheck_seconds)
    rows = await run_in_threadpool(ctx.book.all, [NodeState.HEALTHY])
    chosen = [r for r in rows if r.worker_url and r.joined_via != "pull" and draw.random() < chance]
    limit = asyncio.Semaphore(MAX_CONCURRENT)

    async def one(address: str, url: str) -> None:
        async with limit:
            proof = await challenge_node(ctx.peers, address, url, settings.hardware_n,
                                         settings.hardware_precision, settings.hardware_timeout_seconds)
            await run_in_threadpool(ctx.hardware.record, proof)
            ctx.metrics.hardware.labels(proof.outcome).inc()

    await asyncio.gather(*(one(r.address, r.worker_url or "") for r in chosen))
    return len(chosen)


async def recheck_loop(ctx: Context, is_leader: Callable[[], Awaitable[bool]]) -> None:
    interval = ctx.settings.invite_interval_seconds
    pacing = Pacing("hardware re-challenge pass", interval)
    draw = random.SystemRandom()  # nobody can predict the next draw from the last
    for _ in itertools.count():
        started = time.monotonic()
        try:
            if await is_leader():
                await recheck_pass(ctx, interval, draw)
            pacing.succeeded()
        except Exception:  # a node that hangs up must not end the loop
            pacing.failed()
        await asyncio.sleep(pacing.wait_after(started, time.monotonic()))
