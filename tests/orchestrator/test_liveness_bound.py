"""The liveness check with the default settings: a silent node is Dead within 30 s of its last
heartbeat, whatever the phase of the check loop; a node that beats on time (or a little late) never
turns Unhealthy. Runs `NodeBook.apply_checks` on a real SQLite database with simulated clocks
(no Redis: a pass reads heartbeat times it is given)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from redis.asyncio import Redis
from sqlalchemy import select

from intellect.wire.nodes import NodeState
from orchestrator.db import make_engine, migrate, session_factory
from orchestrator.live import LiveStore
from orchestrator.models import NodeRow
from orchestrator.monitor import liveness
from orchestrator.settings import OrchestratorSettings
from orchestrator.store.nodes import NodeBook

NODE = "0x" + "ab" * 20
DEAD_WITHIN = 30.0  # the documented default bound (issue 12: ≤ 30 s)


def world(tmp_path: Path) -> SimpleNamespace:
    settings = OrchestratorSettings(pool_id=1, state_dir=tmp_path / "orch")
    engine = make_engine(f"sqlite:///{tmp_path / 'orch.db'}")
    migrate(engine)
    sessions = session_factory(engine)
    with sessions() as session, session.begin():
        session.add(NodeRow(address=NODE, state=NodeState.HEALTHY.value, misses=0, in_pool=True))
    live = LiveStore(Redis.from_url("redis://127.0.0.1:9"), 1, settings.heartbeat_ttl_seconds)  # never used
    return SimpleNamespace(settings=settings, sessions=sessions, book=NodeBook(sessions, live))


def apply_checks(ctx: SimpleNamespace, seen: dict[str, float | None], now: float) -> None:
    ctx.book.apply_checks(liveness(ctx), seen, now)


def state_of(ctx: SimpleNamespace) -> str:
    with ctx.sessions() as session:
        return session.scalars(select(NodeRow.state).where(NodeRow.address == NODE)).one()


def test_the_default_bound_is_documented_and_within_30_s(tmp_path: Path) -> None:
    settings = OrchestratorSettings(pool_id=1, state_dir=tmp_path)
    assert settings.dead_within_seconds <= DEAD_WITHIN
    assert settings.heartbeat_ttl_seconds >= 2 * settings.heartbeat_interval_seconds  # one late beat is fine


@pytest.mark.parametrize("phase", [0.0, 0.7, 2.5, 4.99])
def test_a_silent_node_is_dead_within_the_bound(tmp_path: Path, phase: float) -> None:
    ctx = world(tmp_path)
    s = ctx.settings
    last = 10_000.0
    now, seen_states = last + phase, []
    while state_of(ctx) != NodeState.DEAD.value:
        assert now - last <= DEAD_WITHIN, f"still {state_of(ctx)} {now - last:.1f}s after the last heartbeat"
        apply_checks(ctx, {NODE: last}, now)
        seen_states.append(state_of(ctx))
        now += s.check_interval_seconds
    assert NodeState.UNHEALTHY.value in seen_states  # it warned before it declared the node dead
    assert now - s.check_interval_seconds - last <= s.dead_within_seconds


@pytest.mark.parametrize("late", [0.0, 3.0, 9.0])
def test_a_node_beating_on_time_or_a_little_late_stays_healthy(tmp_path: Path, late: float) -> None:
    ctx = world(tmp_path)
    s = ctx.settings
    last = 10_000.0
    for k in range(12):
        gap = s.heartbeat_interval_seconds + (late if k % 3 == 0 else 0.0)  # every third beat is late
        apply_checks(ctx, {NODE: last}, last + gap - 0.01)  # the check just before the next beat lands
        assert state_of(ctx) == NodeState.HEALTHY.value, f"check {k}, {gap:.1f}s since the last beat"
        last += gap


@pytest.mark.parametrize("cut", [20.0, 90.0])
def test_a_partition_that_heals_before_the_ejection_grace_costs_nothing(tmp_path: Path, cut: float) -> None:
    """A link down `cut` seconds: the node is Dead (no work) during it, and Healthy again at the first
    check after its next beat; the ejection grace (120 s of silence) is never reached."""
    ctx = world(tmp_path)
    s = ctx.settings
    assert s.eject_after_seconds > cut + s.heartbeat_interval_seconds + s.check_interval_seconds
    last = 10_000.0
    now = last + s.heartbeat_interval_seconds - 0.01  # the cut starts just before the next beat
    states = []
    while now < last + s.heartbeat_interval_seconds + cut:
        apply_checks(ctx, {NODE: last}, now)
        states.append(state_of(ctx))
        now += s.check_interval_seconds
    if cut >= s.dead_within_seconds:
        assert NodeState.DEAD.value in states  # no work meanwhile
    beat = now  # healed: the worker's next heartbeat lands
    apply_checks(ctx, {NODE: beat}, beat + 0.1)
    assert state_of(ctx) == NodeState.HEALTHY.value

