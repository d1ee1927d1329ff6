"""Liveness loop: every check period, compare last heartbeats (Redis) with the TTL and move node states.

Healthy → Unhealthy when the last heartbeat is older than the TTL; Unhealthy → Dead after
`miss_threshold` such checks in a row; Dead → Healthy when it heartbeats again; Dead nodes still in
the pool whose last heartbeat is `eject_after_seconds` old are ejected on chain (settings).
WaitingForHeartbeat never sticks: after `invite_timeout_seconds` the node goes back to Discovered and
the invite loop invites it again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog
from fastapi.concurrency import run_in_threadpool

from intellect.wire.nodes import NodeState
from orchestrator.context import Context
from orchestrator.pacing import Pacing
from orchestrator.store.nodes import WATCHED, Liveness, may_heartbeat

log = structlog.get_logger("intellect.orchestrator.monitor")


def liveness(ctx: Context) -> Liveness:
    s = ctx.settings
    return Liveness(s.heartbeat_ttl_seconds, s.miss_threshold, s.invite_timeout_seconds)


def live_task_count(ctx: Context) -> int:
    return ctx.tasks.count_live()


async def eject_dead(ctx: Context, seen: dict[str, float | None], now: float) -> None:
    """Eject on chain the Dead nodes silent for `eject_after_seconds` (a Dead node's beat can still
    make it Healthy before that: a partition that heals costs it nothing on chain)."""
    grace = ctx.settings.eject_after_seconds
    dead = [r for r in await run_in_threadpool(ctx.book.all, [NodeState.DEAD]) if r.in_pool]
    for row in dead:
        last = seen.get(row.address)
        if grace and last is not None and now - last < grace:
            continue
        try:
            tx = await run_in_threadpool(ctx.chain.eject, row.address)
        except Exception as exc:  # keep it Dead; the next check retries
            log.warning("eject failed", node=row.address, error=str(exc))
            continue
        ctx.metrics.ejections.inc()
        reason = f"dead: ejected on chain (tx {tx})" if tx else "dead: no longer in the pool"
        await ctx.book.transition(row.address, NodeState.EJECTED, reason, actor="monitor", in_pool=False)
        await ctx.live.forget_seen(row.address)


async def check_pass(ctx: Context, grace_until: float = 0.0) -> None:
    watched = await run_in_threadpool(ctx.book.all, WATCHED)
    seen = await ctx.live.last_seen([r.address for r in watched])
    now = time.time()
    changed = await run_in_threadpool(ctx.book.apply_checks, liveness(ctx), seen, now, grace_until)
    for row in changed:
        await ctx.live.set_state(row.address, NodeState(row.state) if may_heartbeat(row) else None)
    if ctx.settings.eject_dead_nodes:
        await eject_dead(ctx, seen, now)
    for state, count in (await run_in_threadpool(ctx.book.counts)).items():
        ctx.metrics.nodes.labels(state).set(count)
    ctx.metrics.tasks.set(await run_in_threadpool(live_task_count, ctx))


async def monitor_loop(ctx: Context, is_leader: Callable[[], Awaitable[bool]]) -> None:
    grace_until = time.time() + ctx.settings.heartbeat_ttl_seconds
    pacing = Pacing("liveness check", ctx.settings.check_interval_seconds)
    while True:
        started = time.monotonic()
        try:
            if await is_leader():
                await check_pass(ctx, grace_until)
            pacing.succeeded()
        except Exception:
            pacing.failed()
        await asyncio.sleep(pacing.wait_after(started, time.monotonic()))
