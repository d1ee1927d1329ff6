"""`GroupScheduler`: the Plan for node groups, and the loop that keeps the groups in SQL up to date.

Plan (built on every replica when the task version moves; a dict lookup per heartbeat):
- a node in a group runs its group's task with a `GroupContext` (id, index, size, next P2P address,
  the group's secret: HMAC-SHA256 of the task and group ids under the scheduler's key, so every
  replica derives the same one and only the group's members are told it; and the member's own
  transport secret with every member's public key, `member_keys`);
- any other node runs the newest live task without `allowed_topologies`.
The loop (leader only) runs `reconcile` every `groups_interval_seconds` or when poked (a task was
created or deleted) and bumps the version when anything changed; `failed_cooldown_seconds` is the
`group_failed_cooldown_seconds` setting (how long a node whose group task failed sits that task out).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable

import structlog
import zmq
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select
from sqlalchemy.orm import Session
from zmq.utils import z85

from intellect.wire.tasks import AssignedTask, GroupContext, Task
from orchestrator.groups.failures import FAILED_COOLDOWN_SECONDS
from orchestrator.groups.reconcile import Changes, reconcile
from orchestrator.groups.topology import Topology
from orchestrator.models import GroupMemberRow, NodeGroupRow, NodeRow, TaskRow
from orchestrator.pacing import Pacing
from orchestrator.scheduling import Plan, task_from_row

log = structlog.get_logger("intellect.orchestrator.groups")


class GroupPlan:
    def __init__(self, by_node: dict[str, AssignedTask | None], default: AssignedTask | None) -> None:
        self.by_node = by_node
        self.default = default

    def task_for(self, node_address: str) -> AssignedTask | None:
        if node_address in self.by_node:
            return self.by_node[node_address]
        return self.default


def listening_outbox(p2p_address: str | None) -> str | None:
    """Where a member listens for a next member behind NAT: its P2P port + 1 (docs/storage-and-groups.md)."""
    if not p2p_address or ":" not in p2p_address:
        return None
    host, _, port = p2p_address.rpartition(":")
    return f"{host}:{int(port) + 1}" if port.isdigit() and int(port) < 65535 else None


def group_secret(key: bytes, task_id: str, group_id: str) -> str:
    """`${GROUP_SECRET}` of one group running one task: 64 hex characters."""
    return hmac.new(key, f"group-secret|{task_id}|{group_id}".encode(), hashlib.sha256).hexdigest()


def member_keys(key: bytes, task_id: str, group_id: str, addresses: list[str]) -> list[tuple[str, str]]:
    """`(${MEMBER_SECRET}, public key)` of each member of one group running one task, in stage order (64
    hex characters each: a CURVE secret key and its public key). Each member is told its own secret and
    every public key, so its inbox admits its predecessor alone and no member can speak as another.
    Derived under the scheduler's key, not from the group secret the members are told (with which any
    member could work out the others'); the index and node address in each make a member's key change
    when another node takes its place."""
    pairs = []
    for i, address in enumerate(addresses):
        seed = hmac.new(key, f"member-secret|{task_id}|{group_id}|{i}|{address}".encode(), hashlib.sha256)
        public = z85.decode(zmq.curve_public(z85.encode(seed.digest())))
        pairs.append((seed.hexdigest(), public.hex()))
    return pairs


class GroupScheduler:
    """`secret_key`: the key group secrets are derived from (the same on every replica); None: groups
    get no secret."""

    def __init__(self, secret_key: bytes | None = None) -> None:
        self.secret_key = secret_key

    def plan(self, session: Session) -> Plan:
        rows = list(session.scalars(select(TaskRow).where(TaskRow.deleted_at.is_(None))
                                    .order_by(TaskRow.created_at.desc())))
        tasks: dict[str, Task] = {row.id: task_from_row(row) for row in rows}
        plain = next((t for t in tasks.values() if not t.spec.allowed_topologies), None)
        query = select(NodeGroupRow).where(NodeGroupRow.task_id.is_not(None))
        groups = {g.id: g for g in session.scalars(query)}
        members: dict[str, list[GroupMemberRow]] = {}
        for member in session.scalars(select(GroupMemberRow).order_by(GroupMemberRow.position)):
            members.setdefault(member.group_id, []).append(member)
        grouped = [m.node_address for ring in members.values() for m in ring]
        behind_nat = set(session.scalars(select(NodeRow.address).where(
            NodeRow.address.in_(grouped), NodeRow.joined_via == "pull")))  # fmt: skip
        # Grouped nodes never fall back to a plain task: they are reserved for their group's work.
        by_node: dict[str, AssignedTask | None] = {m.node_address: None
                                                   for ring in members.values() for m in ring}
        for gid, group in groups.items():
            task = tasks.get(group.task_id or "")
            ring = members.get(gid, [])
            if task is None or not ring:
                continue
            secret = group_secret(self.secret_key, task.id, gid) if self.secret_key is not None else None
            keys = member_keys(self.secret_key, task.id, gid, [m.node_address for m in ring]) \
                if self.secret_key is not None else []  # fmt: skip
            publics = [public for _, public in keys] or None
            for i, member in enumerate(ring):
                prev, nxt = ring[i - 1], ring[(i + 1) % len(ring)]
                linked = len(ring) > 1
                context = GroupContext(
                    group_id=gid, group_index=i, group_size=len(ring), topology=group.topology, secret=secret,
                    member_secret=keys[i][0] if keys else None, group_keys=publics,
                    members=[m.node_address for m in ring],
                    next_p2p_address=nxt.p2p_address if linked else None,
                    prev_p2p_address=listening_outbox(prev.p2p_address)
                    if linked and member.node_address in behind_nat else None,
                    next_dials_in=linked and nxt.node_address in behind_nat,
                )  # fmt: skip
                by_node[member.node_address] = AssignedTask(task=task, group=context)
        return GroupPlan(by_node, AssignedTask(task=plain) if plain else None)


class GroupKeeper:
    """Runs `reconcile` on the leader: periodically and right after task changes (`poke`)."""

    def __init__(self, sessions: Callable[[], Session], topologies: Callable[[], dict[str, Topology]],
                 bump: Callable[[], Awaitable[int]], interval: float,
                 failed_cooldown_seconds: float = FAILED_COOLDOWN_SECONDS) -> None:
        self.sessions = sessions
        self.topologies = topologies
        self.bump = bump
        self.interval = interval
        self.failed_cooldown_seconds = failed_cooldown_seconds
        self._wake = asyncio.Event()

    def poke(self) -> None:
        self._wake.set()

    def reconcile_once(self) -> Changes:
        with self.sessions() as session, session.begin():
            return reconcile(session, self.topologies(), self.failed_cooldown_seconds)

    async def run_once(self) -> Changes:
        changes = await run_in_threadpool(self.reconcile_once)
        if changes:
            await self.bump()
        return changes

    async def loop(self, is_leader: Callable[[], Awaitable[bool]]) -> None:
        pacing = Pacing("group reconcile", self.interval)
        while True:
            started = time.monotonic()
            self._wake.clear()
            try:
                if await is_leader():
                    await self.run_once()
                pacing.succeeded()
            except Exception:  # a busy database must not end the loop
                pacing.failed()
            remaining = pacing.wait_after(started, time.monotonic())
            # asyncio.timeout, not wait_for: on CPython 3.11, wait_for can swallow a cancellation that
            # lands as the wake event fires, and this loop then outlives the app's shutdown (seen in
            # tests/orchestrator/test_replicas.py under load: the lifespan waited on it for good).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._wake.wait()
