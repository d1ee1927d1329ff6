"""Liveness loop: every check period, compare last heartbeats (Redis) with the TTL and move node states.

Healthy → Unhealthy when the last heartbeat is older than the TTL; Unhealthy → Dead after
`miss_threshold` such checks in a row; Dead → Healthy when it heartbeats again; Dead nodes still in
the pool whose last heartbeat is `eject_after_seconds` old are ejected on chain (settings).
WaitingForHeartbeat never sticks: after `invite_timeout_seconds` the node goes back to Discovered and
the invite loop invites it again.

Why a pass is incremental: reading and judging every watched row each period cost ~2 s of CPU per pass
at 25,000 nodes (0.4 of a core at a 5 s period), to conclude that the Healthy nodes beating on time
stay Healthy. A pass judges only the rows that can change: the unwell ones (Unhealthy, Dead,
WaitingForHeartbeat, from SQL by the state index) and the Healthy ones whose last beat is older than
the TTL (one range read of the `seen` sorted set). A Healthy node that has no `seen` entry at all (the
orchestrator restarted, or Redis lost its data) is not in that range: the `Watchlist` finds those with
a sweep of every Healthy address when this replica starts leading and every `SWEEP_SECONDS`, and keeps
judging them until they beat or leave Healthy. The states reached, and when, are those of a whole pass.
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
from orchestrator.store.nodes import UNWELL, Liveness, mirrored

log = structlog.get_logger("intellect.orchestrator.monitor")
SWEEP_SECONDS = 300.0


def liveness(ctx: Context) -> Liveness:
    s = ctx.settings
    return Liveness(s.heartbeat_ttl_seconds, s.miss_threshold, s.invite_timeout_seconds)


def live_task_count(ctx: Context) -> int:
    return ctx.tasks.count_live()


class Watchlist:
    """Healthy nodes without any heartbeat time in Redis: no range read of `seen` can find them."""

    def __init__(self) -> None:
        self.unseen: set[str] = set()
        self.swept_at: float | None = None  # None: sweep at the next pass

    def forget(self) -> None:
        """Leadership lost: whoever leads next sweeps; this replica sweeps again if it leads again."""
        self.swept_at = None

    async def due(self, ctx: Context, now: float) -> set[str]:
        if self.swept_at is None or now - self.swept_at >= SWEEP_SECONDS:
            healthy = await run_in_threadpool(ctx.book.addresses, [NodeState.HEALTHY])
            seen = await ctx.live.last_seen(healthy)
            self.unseen |= {address for address, last in seen.items() if last is None}
            self.swept_at = now
        return self.unseen

    def settle(self, seen: dict[str, float | None], healthy: set[str]) -> None:
        """After a pass: keep only the nodes still Healthy and still without a heartbeat time."""
        self.unseen = {a for a in self.unseen if a in healthy and seen.get(a) is None}


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


async def check_pass(ctx: Context, grace_until: float = 0.0, watchlist: Watchlist | None = None) -> None:
    """One check over the rows that can change (module docstring); a fresh `Watchlist` sweeps first."""
    watchlist = watchlist or Watchlist()
    now = time.time()
    stale = await ctx.live.stale(now - ctx.settings.heartbeat_ttl_seconds)
    unwell = await run_in_threadpool(ctx.book.addresses, UNWELL)
    unseen = await watchlist.due(ctx, now)
    judged = stale | set(unwell) | unseen
    seen = await ctx.live.last_seen(sorted(judged))
    changed = await run_in_threadpool(ctx.book.apply_checks, liveness(ctx), seen, now, grace_until, judged)
    # One round trip for the pass: after a stall thousands of rows can change at once, and a write per
    # row (a Redis round trip each) made the loop slowest exactly when the orchestrator was behind.
    await ctx.live.set_states({row.address: mirrored(row) for row in changed})
    left = {r.address for r in changed if r.state != NodeState.HEALTHY.value}
    watchlist.settle(seen, unseen - left)
    if ctx.settings.eject_dead_nodes:
        await eject_dead(ctx, seen, now)
    for state, count in (await run_in_threadpool(ctx.book.counts)).items():
        ctx.metrics.nodes.labels(state).set(count)
    ctx.metrics.tasks.set(await run_in_threadpool(live_task_count, ctx))


async def monitor_loop(ctx: Context, is_leader: Callable[[], Awaitable[bool]]) -> None:
    grace_until = time.time() + ctx.settings.heartbeat_ttl_seconds
    pacing = Pacing("liveness check", ctx.settings.check_interval_seconds)
    watchlist = Watchlist()
    while True:
        started = time.monotonic()
        try:
            if await is_leader():
                await check_pass(ctx, grace_until, watchlist)
            else:
                watchlist.forget()
            pacing.succeeded()
        except Exception:
            pacing.failed()
        await asyncio.sleep(pacing.wait_after(started, time.monotonic()))
