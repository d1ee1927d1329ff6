"""The incremental liveness pass (`orchestrator.monitor.check_pass`) on a real SQLite database and a
real Redis: it judges only the unwell rows, the Healthy rows whose last beat is older than the TTL, and
Healthy rows with no beat at all, and reaches the same states a pass over every row would."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from redis.asyncio import Redis
from sqlalchemy import select

from intellect.redis_server import EmbeddedRedis
from intellect.wire.nodes import NodeState
from orchestrator.context import Metrics
from orchestrator.db import make_engine, migrate, session_factory
from orchestrator.live import LiveStore
from orchestrator.models import NodeRow, utcnow
from orchestrator.monitor import Watchlist, check_pass
from orchestrator.settings import OrchestratorSettings
from orchestrator.store.nodes import NodeBook
from orchestrator.store.tasks import TaskStore

STALE, FRESH, NEVER, DOWN = ("0x" + c * 40 for c in "abcd")


@pytest.fixture
def redis_server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


async def nothing() -> None:
    return None


def states(ctx: SimpleNamespace) -> dict[str, str]:
    with ctx.sessions() as session:
        return {r.address: r.state for r in session.scalars(select(NodeRow))}


async def world(tmp_path: Path, redis_url: str) -> SimpleNamespace:
    settings = OrchestratorSettings(pool_id=1, state_dir=tmp_path / "orch", eject_dead_nodes=False)
    engine = make_engine(f"sqlite:///{tmp_path / 'orch.db'}")
    migrate(engine)
    sessions = session_factory(engine)
    with sessions() as session, session.begin():
        session.add_all(NodeRow(address=a, state=s.value, misses=0, in_pool=True, invite_attempts=0,
                                state_changed_at=utcnow(), created_at=utcnow())
                        for a, s in ((STALE, NodeState.HEALTHY), (FRESH, NodeState.HEALTHY),
                                     (NEVER, NodeState.HEALTHY), (DOWN, NodeState.DEAD)))
    live = LiveStore(Redis.from_url(redis_url), 1, settings.heartbeat_ttl_seconds)
    book = NodeBook(sessions, live)
    await book.rebuild_mirror()
    return SimpleNamespace(settings=settings, sessions=sessions, live=live, book=book, metrics=Metrics(),
                           tasks=TaskStore(sessions, nothing))


def test_only_nodes_whose_deadline_passed_die(tmp_path: Path, redis_server: EmbeddedRedis) -> None:
    async def run() -> None:
        ctx = await world(tmp_path, redis_server.url)
        ttl = ctx.settings.heartbeat_ttl_seconds
        watchlist = Watchlist()
        for _ in range(ctx.settings.miss_threshold):  # Unhealthy after the first pass, Dead after the last
            now = time.time()
            await ctx.live.redis.zadd(ctx.live.seen_key, {STALE: now - ttl - 5, FRESH: now, DOWN: now - 500})
            await check_pass(ctx, 0.0, watchlist)
        found = states(ctx)
        assert found[STALE] == NodeState.DEAD.value  # deadline passed: judged through the `seen` range
        assert found[NEVER] == NodeState.DEAD.value  # never beat: found by the watchlist's sweep
        assert found[FRESH] == NodeState.HEALTHY.value  # deadline ahead: never touched
        assert found[DOWN] == NodeState.DEAD.value
        mirror = await ctx.live.redis.hgetall(ctx.live.state_key)
        assert mirror[STALE.encode()] == b"Dead" and mirror[FRESH.encode()] == b"Healthy"
        assert mirror[NEVER.encode()] == b"Dead"  # every row a pass changed is mirrored (one write)
        # a Dead node that beats again is Healthy at the next pass (the unwell are judged every time)
        await ctx.live.redis.zadd(ctx.live.seen_key, {DOWN: time.time()})
        await check_pass(ctx, 0.0, watchlist)
        assert states(ctx)[DOWN] == NodeState.HEALTHY.value
        assert await ctx.live.redis.hget(ctx.live.state_key, DOWN) == b"Healthy"
        await ctx.live.redis.aclose()

    asyncio.run(run())


def test_no_node_is_counted_missing_during_the_start_up_grace(tmp_path: Path,
                                                              redis_server: EmbeddedRedis) -> None:
    async def run() -> None:
        ctx = await world(tmp_path, redis_server.url)
        await check_pass(ctx, time.time() + 60, Watchlist())
        found = states(ctx)
        assert found[NEVER] == NodeState.HEALTHY.value and found[STALE] == NodeState.HEALTHY.value
        await ctx.live.redis.aclose()

    asyncio.run(run())


def test_a_mass_move_logs_one_summary_and_audits_every_node(tmp_path: Path,
                                                            redis_server: EmbeddedRedis) -> None:
    """After a stall many nodes turn Unhealthy in one pass: one summary log line, not one per node,
    while every node's move is still an audit row. A small pass logs each node as before."""
    import structlog

    from orchestrator.models import AuditRow
    from orchestrator.store.nodes import LOG_EACH_UP_TO

    async def run() -> None:
        ctx = await world(tmp_path, redis_server.url)
        ttl = ctx.settings.heartbeat_ttl_seconds
        now = time.time()
        await ctx.live.redis.zadd(ctx.live.seen_key, {STALE: now - ttl - 5, FRESH: now, DOWN: now - 500})
        with structlog.testing.capture_logs() as logs:  # a small pass: STALE and NEVER, one line each
            await check_pass(ctx, 0.0, Watchlist())
        each = [e for e in logs if e["event"] == "node state"]
        assert {e["node"] for e in each} == {STALE, NEVER} and len(each) == 2
        assert not [e for e in logs if e["event"] == "node states"]

        many = [f"0x{i:040x}" for i in range(1, LOG_EACH_UP_TO + 11)]
        with ctx.sessions() as session, session.begin():
            session.add_all(NodeRow(address=a, state=NodeState.HEALTHY.value, misses=0, in_pool=True,
                                    invite_attempts=0, state_changed_at=utcnow(), created_at=utcnow())
                            for a in many)
        await ctx.live.redis.zadd(ctx.live.seen_key, {a: time.time() - ttl - 5 for a in many})
        before = states(ctx)
        with structlog.testing.capture_logs() as logs:
            await check_pass(ctx, 0.0, Watchlist())
        after = states(ctx)
        moved = {a for a in after if after[a] != before.get(a)}
        summaries = [e for e in logs if e["event"] == "node states"]
        assert [e["nodes"] for e in summaries] == [len(moved)]
        assert summaries[0]["moves"]["Healthy->Unhealthy"] == len(many)
        assert sum(summaries[0]["moves"].values()) == len(moved)
        assert not [e for e in logs if e["event"] == "node state"]
        with ctx.sessions() as session:
            audited = [r.subject for r in session.scalars(select(AuditRow).where(AuditRow.action == "state"))]
        assert set(many) <= set(audited) and len(audited) == 2 + len(moved)  # every move of both passes
        with ctx.sessions() as session:
            row = session.scalars(select(AuditRow).where(AuditRow.subject == many[0])).one()
        assert (row.actor, row.detail["old"], row.detail["new"]) == ("monitor", "Healthy", "Unhealthy")
        assert "heartbeat older than" in row.detail["reason"] and row.at is not None
        await ctx.live.redis.aclose()

    asyncio.run(run())
