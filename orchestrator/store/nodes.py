"""Node records and state transitions: SQL is the record, the Redis state hash the hot-path mirror.

`NodeBook` is the writer routes and the heartbeat use (one state transition per call, mirrored to
Redis). Two loops still write node rows themselves, in one transaction over every row, because their
whole pass must be atomic: `invites.reconcile` (discovery/chain upsert) and `monitor.apply_checks`
(liveness). Moved here from `orchestrator/nodes.py`, which re-exports it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from intellect.wire.admin import NodeRecord
from intellect.wire.nodes import NodeState
from orchestrator.live import LiveStore
from orchestrator.models import AuditRow, NodeRow, utcnow

log = structlog.get_logger("intellect.orchestrator.nodes")


def may_heartbeat(row: NodeRow) -> bool:
    """Discovered nodes outside the pool have no business heartbeating; everyone else is answered."""
    return row.state != NodeState.DISCOVERED or row.in_pool


def audit(session: Session, actor: str, action: str, subject: str | None, **detail: Any) -> None:
    session.add(AuditRow(actor=actor, action=action, subject=subject, detail=detail or None))


def to_record(row: NodeRow) -> NodeRecord:
    def aware(value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value else None

    return NodeRecord(
        address=row.address, state=NodeState(row.state), provider=row.provider, worker_url=row.worker_url,
        in_pool=row.in_pool, misses=row.misses, invite_attempts=row.invite_attempts, reason=row.reason,
        last_heartbeat_at=aware(row.last_heartbeat_at), state_changed_at=aware(row.state_changed_at),
    )


class NodeBook:
    def __init__(self, sessions: Callable[[], Session], live: LiveStore) -> None:
        self.sessions = sessions
        self.live = live

    def _set(self, session: Session, row: NodeRow, state: NodeState, reason: str | None, actor: str) -> None:
        if row.state != state.value:
            audit(session, actor, "state", row.address, old=row.state, new=state.value, reason=reason)
            log.info("node state", node=row.address, old=row.state, new=state.value, reason=reason)
            row.state = state.value
            row.state_changed_at = utcnow()
        row.reason = reason
        if state in (NodeState.HEALTHY, NodeState.WAITING_FOR_HEARTBEAT, NodeState.DISCOVERED):
            row.misses = 0

    async def sync_mirror(self, row: NodeRow) -> None:
        await self.live.set_state(row.address, NodeState(row.state) if may_heartbeat(row) else None)

    async def transition(self, address: str, state: NodeState, reason: str | None = None,
                         actor: str = "orchestrator", only_from: NodeState | None = None,
                         **fields: Any) -> NodeRow | None:
        """Move a node to `state`; with `only_from`, only if it is still in that state (compare-and-set
        in one transaction, so a slow invite cannot overwrite the Healthy its first heartbeat set)."""

        def apply() -> NodeRow | None:
            with self.sessions() as session, session.begin():
                row = session.get(NodeRow, address)
                if row is None:
                    return None
                if only_from is not None and row.state != only_from.value:
                    return row
                self._set(session, row, state, reason, actor)
                for key, value in fields.items():
                    setattr(row, key, value)
                return row

        row = await run_in_threadpool(apply)
        if row is not None:
            await self.sync_mirror(row)
        return row

    def get(self, address: str) -> NodeRow | None:
        with self.sessions() as session:
            return session.get(NodeRow, address)

    def all(self, states: list[NodeState] | None = None) -> list[NodeRow]:
        with self.sessions() as session:
            query = select(NodeRow).order_by(NodeRow.address)
            if states:
                query = query.where(NodeRow.state.in_([s.value for s in states]))
            return list(session.scalars(query))

    def counts(self) -> dict[str, int]:
        with self.sessions() as session:
            found = dict(session.execute(select(NodeRow.state, func.count()).group_by(NodeRow.state)).all())
        return {state.value: int(found.get(state.value, 0)) for state in NodeState}

    async def rebuild_mirror(self) -> None:
        rows = await run_in_threadpool(self.all)
        await self.live.replace_states({r.address: NodeState(r.state) for r in rows if may_heartbeat(r)})
