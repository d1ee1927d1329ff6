"""Node records and state transitions: SQL is the record, the Redis state hash the hot-path mirror.

`NodeBook` is the only writer of node rows: single state transitions for routes, the heartbeat and
the loops (mirrored to Redis), and the two whole passes whose every row must change in one
transaction: `reconcile` (the invite loop's discovery/chain upsert) and `apply_checks` (the liveness
loop). The loops decide when to run a pass; what a pass does to the rows lives here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import ColumnElement, func, insert, select
from sqlalchemy.orm import Session

from intellect.wire.admin import NodeRecord
from intellect.wire.nodes import DiscoveredNode, NodeState
from orchestrator.live import LiveStore
from orchestrator.models import AuditRow, NodeRow, utcnow

log = structlog.get_logger("intellect.orchestrator.nodes")
# The states a liveness check looks at.
WATCHED = [NodeState.HEALTHY, NodeState.UNHEALTHY, NodeState.WAITING_FOR_HEARTBEAT, NodeState.DEAD]


# Rows judged at every check whatever Redis says (the Healthy are judged only when their beat is stale).
UNWELL = [NodeState.UNHEALTHY, NodeState.WAITING_FOR_HEARTBEAT, NodeState.DEAD]
CHUNK = 500  # addresses per `IN (...)`: well under SQLite's bound-parameter limit


def may_heartbeat(row: NodeRow) -> bool:
    """Discovered nodes outside the pool have no business heartbeating; everyone else is answered."""
    return mirrored_state(row.state, row.in_pool) is not None


def mirrored_state(state: str, in_pool: bool) -> NodeState | None:
    """What the Redis state hash holds for a row in this state (None: absent, the heartbeat is refused)."""
    return NodeState(state) if state != NodeState.DISCOVERED or in_pool else None


def mirrored(row: NodeRow) -> NodeState | None:
    return mirrored_state(row.state, row.in_pool)


def audit(session: Session, actor: str, action: str, subject: str | None, **detail: Any) -> None:
    session.add(AuditRow(actor=actor, action=action, subject=subject, detail=detail or None))


def to_record(row: NodeRow) -> NodeRecord:
    def aware(value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value else None

    return NodeRecord(
        address=row.address, state=NodeState(row.state), provider=row.provider, worker_url=row.worker_url,
        in_pool=row.in_pool, misses=row.misses, invite_attempts=row.invite_attempts, reason=row.reason,
        joined_via="push" if row.joined_via == "push" else "pull" if row.joined_via == "pull" else None,
        last_heartbeat_at=aware(row.last_heartbeat_at), state_changed_at=aware(row.state_changed_at),
    )


@dataclass(frozen=True)
class Liveness:
    """What a liveness check judges by (from the orchestrator's settings)."""

    ttl_seconds: float
    miss_threshold: int
    invite_timeout_seconds: float


def _at(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts, UTC).replace(tzinfo=None) if ts else None


def _new_row(address: str, in_pool: bool, reason: str | None = None) -> NodeRow:
    now = utcnow()
    return NodeRow(address=address, state=NodeState.DISCOVERED.value, misses=0, in_pool=in_pool,
                   invite_attempts=0, state_changed_at=now, created_at=now, reason=reason)


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
        await self.live.set_state(row.address, mirrored(row))

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

    def addresses(self, states: list[NodeState]) -> list[str]:
        """Addresses only (no row objects): cheap enough for a check pass at tens of thousands of rows."""
        with self.sessions() as session:
            return list(session.scalars(select(NodeRow.address).where(
                NodeRow.state.in_([s.value for s in states]))))

    def counts(self) -> dict[str, int]:
        with self.sessions() as session:
            found = dict(session.execute(select(NodeRow.state, func.count()).group_by(NodeRow.state)).all())
        return {state.value: int(found.get(state.value, 0)) for state in NodeState}

    def mirror_states(self) -> dict[str, NodeState | None]:
        """What the Redis state hash should hold for every row (None: absent), from three plain columns.

        Why not `all()`: building 25,000 ORM objects cost each API process 0.4-0.5 s of CPU at start-up,
        while a restarted fleet's first heartbeats were already arriving; the three columns ~0.1 s."""
        with self.sessions() as session:
            rows = session.execute(select(NodeRow.address, NodeRow.state, NodeRow.in_pool))
            return {address: mirrored_state(state, in_pool) for address, state, in_pool in rows}

    async def rebuild_mirror(self) -> None:
        states = await run_in_threadpool(self.mirror_states)
        await self.live.replace_states({a: s for a, s in states.items() if s is not None})

    def reconcile(self, records: list[DiscoveredNode], on_chain: set[str]) -> Reconciled:
        """Upsert node rows from discovery and the chain in one transaction; return the rows it touched
        and the mirror entries that changed (one Redis write per changed node, not per row).

        Only the rows that can change are loaded as objects: new ones, those whose discovery record
        is newer than the one stored (discovery stamps `last_updated` on every write), and those
        whose pool membership on chain differs. Loading every row each pass cost ~1.1 s of CPU at
        25,000 nodes; the light read of three columns that finds them costs a tenth of it.

        A node in the pool on chain but unknown here (a restart with a fresh database) is recorded to
        be invited again; an Ejected or Dead node that discovery lists anew, and that is off chain, is
        Discovered again; a Healthy or Unhealthy node no longer in the pool on chain is Ejected."""
        with self.sessions() as session, session.begin():
            known = {address: (in_pool, updated) for address, in_pool, updated in session.execute(
                select(NodeRow.address, NodeRow.in_pool, NodeRow.discovery_updated_at))}
            touch = {address for address, (in_pool, _) in known.items() if in_pool != (address in on_chain)}
            touch |= {r.metadata.node_address for r in records
                      if known.get(r.metadata.node_address, (None, None))[1] != _naive(r.last_updated)}
            rows = {row.address: row for row in _rows(session, touch & known.keys())}
            before = {address: mirrored(row) for address, row in rows.items()}
            for record in records:
                meta = record.metadata
                if meta.node_address in known and meta.node_address not in rows:
                    continue  # the same record as at the last pass: nothing to write
                row = rows.get(meta.node_address)
                updated = _naive(record.last_updated)
                if row is None:
                    row = rows[meta.node_address] = _new_row(meta.node_address, in_pool=False)
                    session.add(row)
                    audit(session, "discovery", "discovered", row.address)
                came_back = (row.state in (NodeState.EJECTED.value, NodeState.DEAD.value)
                             and meta.node_address not in on_chain
                             and (row.discovery_updated_at is None or updated > row.discovery_updated_at)
                             and updated > row.state_changed_at)
                row.provider, row.ip_address, row.port = meta.provider_address, meta.ip_address, meta.port
                row.node_metadata = meta.model_dump(mode="json")
                row.discovery_updated_at = updated
                if came_back:
                    back = "back in discovery: re-inviting"
                    self._set(session, row, NodeState.DISCOVERED, back, "discovery")
                    row.invite_attempts, row.next_invite_at = 0, None
            for address in on_chain - known.keys() - rows.keys():
                row = rows[address] = _new_row(
                    address, in_pool=True, reason="in the pool on chain but unknown here: reconciling"
                )
                session.add(row)
                audit(session, "chain", "reconciled", address)
            for row in rows.values():
                was_in_pool, row.in_pool = row.in_pool, row.address in on_chain
                if was_in_pool and not row.in_pool and row.state in (NodeState.HEALTHY.value,
                                                                      NodeState.UNHEALTHY.value):
                    self._set(session, row, NodeState.EJECTED, "no longer in the pool on chain", "chain")
            changed = {a: m for a, row in rows.items() if (m := mirrored(row)) != before.get(a)}
            return Reconciled(list(rows.values()), changed)

    def apply_checks(
        self, policy: Liveness, seen: dict[str, float | None], now: float, grace_until: float = 0.0,
        only: Collection[str] | None = None,
    ) -> list[NodeRow]:
        """One liveness check over the watched nodes in one transaction; returns the rows whose state
        changed. `seen` holds each node's last heartbeat (unix time, from Redis). With `only`, just the
        watched rows among those addresses are judged (the monitor passes the unwell and the stale: a
        Healthy node with a fresh beat would not change).

        Healthy → Unhealthy when the last heartbeat is older than the TTL; Unhealthy → Dead after
        `miss_threshold` such checks in a row; Dead (still in the pool) → Healthy on a fresh heartbeat;
        WaitingForHeartbeat → Discovered (re-invite) after the
        invite timeout. Until `grace_until` (start-up + TTL) a missing heartbeat is not counted: after
        an orchestrator restart, nodes get one TTL to find it again before they can turn Unhealthy."""
        ttl = policy.ttl_seconds
        changed: list[NodeRow] = []
        moves: list[tuple[str, str, str, str | None]] = []
        with self.sessions() as session, session.begin():
            for row in _watched_rows(session, only):
                last = seen.get(row.address)
                fresh = last is not None and now - last <= ttl
                old = row.state
                if row.state in (NodeState.HEALTHY.value, NodeState.UNHEALTHY.value):
                    if fresh:
                        row.state, row.misses, row.reason = NodeState.HEALTHY.value, 0, None
                    elif now >= grace_until:
                        row.misses += 1
                        if row.misses >= (misses := policy.miss_threshold):
                            row.state = NodeState.DEAD.value
                            row.reason = f"no heartbeat for {misses} checks after the {ttl}s TTL"
                        else:
                            row.state = NodeState.UNHEALTHY.value
                            row.reason = f"heartbeat older than {ttl}s ({row.misses} missed checks)"
                elif row.state == NodeState.DEAD.value:
                    if fresh and row.in_pool:  # back before its ejection: a link that dropped, healed
                        row.state, row.misses, row.reason = NodeState.HEALTHY.value, 0, None
                elif row.state == NodeState.WAITING_FOR_HEARTBEAT.value:
                    timeout = policy.invite_timeout_seconds
                    if fresh:
                        row.state, row.reason = NodeState.HEALTHY.value, None
                    elif row.invited_at and (utcnow() - row.invited_at).total_seconds() > timeout:
                        row.state, row.next_invite_at = NodeState.DISCOVERED.value, None
                        row.reason = f"no heartbeat within {timeout}s of the invite: re-inviting"
                if row.state != old:
                    # Written on state changes only: the admin API reads live heartbeat times from Redis,
                    # and one UPDATE per node per pass dominated the check at 10,000 nodes.
                    if last:
                        row.last_heartbeat_at = _at(last)
                    row.state_changed_at = utcnow()
                    moves.append((row.address, old, row.state, row.reason))
                    changed.append(row)
            if moves:  # one multi-row INSERT: ORM objects cost ~0.15 ms a row, in the thousands after a stall
                session.execute(insert(AuditRow), [
                    {"actor": "monitor", "action": "state", "subject": address, "at": utcnow(),
                     "detail": {"old": old, "new": new, "reason": reason}}
                    for address, old, new, reason in moves])
        _log_moves(moves)
        return changed


# A pass that moves more nodes than this logs one summary line instead of a line per node (every move
# is still an audit row): after a stall of the orchestrator thousands of nodes turn Unhealthy at once,
# and 20,000 log lines cost the loop ~3 s of CPU exactly when it was already behind.
LOG_EACH_UP_TO = 50


def _log_moves(moves: list[tuple[str, str, str, str | None]]) -> None:
    if len(moves) <= LOG_EACH_UP_TO:
        for address, old, new, reason in moves:
            log.info("node state", node=address, old=old, new=new, reason=reason)
        return
    counts = Counter(f"{old}->{new}" for _, old, new, _ in moves)
    log.warning("node states", nodes=len(moves), moves=dict(counts), first=[m[0] for m in moves[:5]],
                detail="each node's move is a row of the audit_log table")


@dataclass(frozen=True)
class Reconciled:
    """What `NodeBook.reconcile` did: the rows it touched, and the Redis mirror entries that must change."""

    rows: list[NodeRow]
    mirror: dict[str, NodeState | None]


def _naive(moment: datetime) -> datetime:
    """As the database stores it: UTC without a zone."""
    return moment.astimezone(UTC).replace(tzinfo=None)


def _rows(session: Session, addresses: Collection[str], *where: ColumnElement[bool]) -> Iterator[NodeRow]:
    ordered = sorted(addresses)
    for at in range(0, len(ordered), CHUNK):
        yield from session.scalars(select(NodeRow).where(*where, NodeRow.address.in_(ordered[at:at + CHUNK])))


def _watched_rows(session: Session, only: Collection[str] | None) -> Iterator[NodeRow]:
    watched = NodeRow.state.in_([w.value for w in WATCHED])
    if only is None:
        return iter(session.scalars(select(NodeRow).where(watched)))
    return _rows(session, only, watched)
