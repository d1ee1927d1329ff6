"""Liveness loop: every check period, compare last heartbeats (Redis) with the TTL and move node states.

Healthy → Unhealthy when the last heartbeat is older than the TTL; Unhealthy → Dead after
`miss_threshold` such checks in a row; Dead nodes still in the pool are ejected on chain (setting).
WaitingForHeartbeat never sticks: after `invite_timeout_seconds` the node goes back to Discovered and
the invite loop invites it again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import structlog
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select

from intellect.wire.nodes import NodeState
from orchestrator.context import Context
from orchestrator.models import NodeRow, utcnow
from orchestrator.pacing import Pacing
from orchestrator.store.nodes import audit, may_heartbeat

log = structlog.get_logger("intellect.orchestrator.monitor")
WATCHED = [NodeState.HEALTHY, NodeState.UNHEALTHY, NodeState.WAITING_FOR_HEARTBEAT, NodeState.DEAD]


def _at(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts, UTC).replace(tzinfo=None) if ts else None


def apply_checks(
    ctx: Context, seen: dict[str, float | None], now: float, grace_until: float = 0.0
) -> list[NodeRow]:
    """One check over the watched nodes in one transaction; returns the rows whose state changed.

    Until `grace_until` (start-up + TTL) a missing heartbeat is not counted as a miss: after an
    orchestrator restart, nodes get one TTL to find it again before they can turn Unhealthy.
    """
    s = ctx.settings
    ttl = s.heartbeat_ttl_seconds
    changed: list[NodeRow] = []
    with ctx.sessions() as session, session.begin():
        rows = session.scalars(select(NodeRow).where(NodeRow.state.in_([w.value for w in WATCHED])))
        for row in rows:
            last = seen.get(row.address)
            fresh = last is not None and now - last <= s.heartbeat_ttl_seconds
            old = row.state
            if row.state in (NodeState.HEALTHY.value, NodeState.UNHEALTHY.value):
                if fresh:
                    row.state, row.misses, row.reason = NodeState.HEALTHY.value, 0, None
                elif now < grace_until:
                    pass
                else:
                    row.misses += 1
                    if row.misses >= s.miss_threshold:
                        row.state = NodeState.DEAD.value
                        row.reason = f"no heartbeat for {s.miss_threshold} checks after the {ttl}s TTL"
                    else:
                        row.state = NodeState.UNHEALTHY.value
                        row.reason = f"heartbeat older than {ttl}s ({row.misses} missed checks)"
            elif row.state == NodeState.WAITING_FOR_HEARTBEAT.value:
                if fresh:
                    row.state, row.reason = NodeState.HEALTHY.value, None
                elif row.invited_at and (utcnow() - row.invited_at).total_seconds() > \
                        s.invite_timeout_seconds:
                    row.state, row.next_invite_at = NodeState.DISCOVERED.value, None
                    row.reason = f"no heartbeat within {s.invite_timeout_seconds}s of the invite: re-inviting"
            if row.state != old:
                # Written on state changes only: the admin API reads live heartbeat times from Redis,
                # and one UPDATE per node per pass dominated the check at 10,000 nodes.
                if last:
                    row.last_heartbeat_at = _at(last)
                row.state_changed_at = utcnow()
                audit(session, "monitor", "state", row.address, old=old, new=row.state, reason=row.reason)
                log.info("node state", node=row.address, old=old, new=row.state, reason=row.reason)
                changed.append(row)
    return changed


def live_task_count(ctx: Context) -> int:
    return ctx.tasks.count_live()


async def eject_dead(ctx: Context) -> None:
    dead = [r for r in await run_in_threadpool(ctx.book.all, [NodeState.DEAD]) if r.in_pool]
    for row in dead:
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
    changed = await run_in_threadpool(apply_checks, ctx, seen, time.time(), grace_until)
    for row in changed:
        await ctx.live.set_state(row.address, NodeState(row.state) if may_heartbeat(row) else None)
    if ctx.settings.eject_dead_nodes:
        await eject_dead(ctx)
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
