"""The group keeper's pass: dissolve broken groups, merge small idle ones, form new ones, give each a task.

`reconcile(session, topologies)` is one pass in one transaction; it returns what it changed so the
caller bumps the plan version (every replica then rebuilds its Plan). Only the leader runs it. It
decides; the rows change through `orchestrator/store/groups.py`, their only writer.
A member whose task failed for good breaks its group like a dead one, and its node sits out that task
for a cooldown (`orchestrator/groups/failures.py` says why).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import structlog
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from intellect.wire.nodes import ComputeSpecs, NodeMetadata, NodeState
from intellect.wire.tasks import TaskSpec, TaskState
from orchestrator.groups.failures import (
    FAILED_COOLDOWN_SECONDS,
    Failed,
    failed_assignments,
    failed_members,
    recently_failed,
)
from orchestrator.groups.formation import Candidate, form_groups, merge_candidates, ring_order
from orchestrator.groups.nearness import trusted_links
from orchestrator.groups.topology import Topology, parse_topology_name
from orchestrator.models import AssignmentRow, GroupMemberRow, NodeGroupRow, NodeRow, TaskRow, utcnow
from orchestrator.store.groups import Seat, assign_group, dissolve_group, form_group
from orchestrator.store.hardware import MAX_FAILED, PROVEN, failed_counts, latest_proofs
from orchestrator.store.round_trips import reports

log = structlog.get_logger("intellect.orchestrator.groups")

# A member in any other state (Dead, Ejected, Banned, re-invited...) breaks its group.
MEMBER_OK = {NodeState.HEALTHY.value, NodeState.UNHEALTHY.value}
NO_SPECS = ComputeSpecs(cpu_cores=0, ram_mb=0, disk_free_mb=0)


class UnknownTopology(ValueError):
    pass


def resolve_topology(name: str, configured: dict[str, Topology]) -> Topology:
    """A configured topology by name, else the name parsed ("2x640GB")."""
    if name in configured:
        return configured[name]
    try:
        return parse_topology_name(name)
    except ValueError:
        known = ", ".join(sorted(configured)) or "none configured"
        raise UnknownTopology(f"unknown topology {name!r} (configured: {known}; or a name like 2x640GB)") \
            from None


@dataclass
class Changes:
    dissolved: list[tuple[str, str]] = field(default_factory=list)  # (group id, reason)
    formed: list[str] = field(default_factory=list)
    merged: list[tuple[str, str, str]] = field(default_factory=list)  # (a, b, new id)
    assigned: list[tuple[str, str]] = field(default_factory=list)  # (group id, task id)

    def __bool__(self) -> bool:
        return bool(self.dissolved or self.formed or self.merged or self.assigned)


def _metadata(row: NodeRow) -> NodeMetadata | None:
    if not row.node_metadata:
        return None
    try:
        return NodeMetadata.model_validate(row.node_metadata)
    except ValidationError:
        return None


def peer_inbox(row: NodeRow) -> str | None:
    """The peer inbox the node advertised (`p2p_port`), else its API port, at the address the pool uses."""
    meta = _metadata(row)
    port = meta.p2p_port if meta is not None and meta.p2p_port is not None else row.port
    return f"{row.ip_address}:{port}" if row.ip_address and port else None


def candidate(row: NodeRow, proven: dict[str, float] | None = None,
              rtt: dict[str, float] | None = None) -> Candidate:  # fmt: skip
    """The node as formation sees it. Its speed is what it proved (`proven`: FLOP/s of its latest
    hardware challenge, orchestrator/store/hardware.py), never the throughput it reports of itself;
    `rtt`: the orchestrator's measured round trip to it (ms, with that proof)."""
    meta = _metadata(row)
    return Candidate(address=row.address, specs=meta.compute_specs if meta else NO_SPECS,
                     location=meta.location if meta else None, p2p_address=peer_inbox(row),
                     throughput=(proven or {}).get(row.address), rtt_ms=(rtt or {}).get(row.address),
                     # its API could not be called when it was invited (it fetched the invite itself):
                     # nobody can open a connection to it, its peers included
                     reachable=row.joined_via != "pull")


def placement_links(session: Session, free: list[Candidate]) -> tuple[dict[frozenset[str], float], set[str]]:
    """What formation may trust of the round trips the free nodes reported (orchestrator/groups/
    nearness.py): the links both ends measured and agree on, none touching a node whose reports
    contradict its peers' (those nodes, returned too, are placed by the orchestrator's round trips)."""
    said = reports(session, [c.address for c in free])
    return trusted_links(said, [c.address for c in free if not c.reachable])


@dataclass
class _Pass:
    """What one pass reads once and its steps share. `groups` and `members` follow the steps' changes:
    a dissolved group leaves both, a merged or formed one enters both (members in ring order)."""

    session: Session
    allowed: dict[str, list[Topology]]  # live group task id → its usable topologies, oldest task first
    caps: dict[str, int]  # live group task id → the most groups it runs at once (tasks with a cap only)
    groups: dict[str, NodeGroupRow]
    members: dict[str, list[GroupMemberRow]]
    nodes: dict[str, NodeRow]
    proven: dict[str, float]  # FLOP/s of each node's latest proven hardware challenge
    rtt: dict[str, float]  # the orchestrator's round trip to each node, with that challenge
    failed: Failed
    changes: Changes = field(default_factory=Changes)

    def dissolve(self, gid: str, reason: str) -> None:
        group = self.groups.pop(gid)
        self.members.pop(gid, None)
        dissolve_group(self.session, group, reason)
        log.info("group dissolved", group=gid, reason=reason)
        self.changes.dissolved.append((gid, reason))

    def create(self, topology: str, members: list[Candidate], task_id: str | None) -> str:
        """A new group of `members`, their stage order drawn with the group's id."""
        gid = str(uuid.uuid4())
        positions = {m.address: i for i, m in enumerate(ring_order(members, draw=gid))}
        seats = [Seat(m.address, positions[m.address], m.p2p_address) for m in members]
        self.groups[gid], self.members[gid] = form_group(self.session, gid, topology, seats, task_id)
        return gid

    def topologies_of(self, task_id: str) -> set[str]:
        return {t.name for t in self.allowed[task_id]}

    def room(self, task_id: str) -> float:
        """How many more groups the task takes (`max_groups` less the groups it has; no cap: no end)."""
        if task_id not in self.caps:
            return float("inf")
        return self.caps[task_id] - sum(1 for g in self.groups.values() if g.task_id == task_id)

    def wanted(self, topology: str) -> float:
        """How many new groups of `topology` the live tasks can use: the room of the tasks that allow it,
        less the groups of it formed and not yet given a task."""
        room = sum(self.room(tid) for tid in self.allowed if topology in self.topologies_of(tid))
        waiting = sum(1 for g in self.groups.values() if g.task_id is None and g.topology == topology)
        return room - waiting


def allowed_topologies(
    session: Session, configured: dict[str, Topology]
) -> tuple[dict[str, list[Topology]], dict[str, int]]:
    """Each live task that asks for groups → the topologies it allows that resolve, oldest task first. A
    name that no longer resolves (the settings changed since the task was accepted) is logged and left
    out; a task left with none keeps its entry, empty, so its groups are dissolved. Second: the tasks'
    `max_groups`, for those that set one."""
    allowed: dict[str, list[Topology]] = {}
    caps: dict[str, int] = {}
    tasks = session.scalars(select(TaskRow).where(TaskRow.deleted_at.is_(None)).order_by(TaskRow.created_at))
    for task in tasks:
        spec = TaskSpec.model_validate(task.spec)
        names = spec.allowed_topologies
        if names and spec.max_groups is not None:
            caps[task.id] = spec.max_groups
        resolved = []
        for name in names:
            try:
                resolved.append(resolve_topology(name, configured))
            except UnknownTopology as exc:
                log.warning("task topology unusable", task=task.id, error=str(exc))
        if names:
            allowed[task.id] = resolved
    return allowed, caps


def _read(session: Session, allowed: dict[str, list[Topology]], caps: dict[str, int],
          groups: dict[str, NodeGroupRow]) -> _Pass:  # fmt: skip
    latest = latest_proofs(session)
    members: dict[str, list[GroupMemberRow]] = {gid: [] for gid in groups}
    for member in session.scalars(select(GroupMemberRow).order_by(GroupMemberRow.position)):
        members.setdefault(member.group_id, []).append(member)
    proven = {a: p.flops for a, p in latest.items() if p.outcome == PROVEN and p.flops is not None}
    return _Pass(session=session, allowed=allowed, caps=caps, groups=groups, members=members,
                 nodes={row.address: row for row in session.scalars(select(NodeRow))}, proven=proven,
                 rtt={a: p.rtt_ms for a, p in latest.items() if p.rtt_ms is not None},
                 failed=failed_assignments(session, allowed))  # fmt: skip


def _broken(run: _Pass, gid: str) -> str | None:
    """Why the group must go (None: it stays): a member died or left the books, the group's task is
    gone or no longer fits it, or a member's task failed for good."""
    group, nodes = run.groups[gid], run.nodes
    bad = [m.node_address for m in run.members[gid]
           if m.node_address not in nodes or nodes[m.node_address].state not in MEMBER_OK]
    if bad:
        return "member lost: " + ", ".join(f"{a} {nodes[a].state if a in nodes else 'unknown'}" for a in bad)
    if group.task_id is None:
        if any(group.topology in run.topologies_of(tid) for tid in run.allowed):
            return None
        return f"no live task asks for topology {group.topology}"
    if group.task_id not in run.allowed:
        return f"task {group.task_id} was deleted"
    if group.topology not in run.topologies_of(group.task_id):
        return f"task {group.task_id} no longer allows topology {group.topology}"
    return failed_members(group, run.members[gid], run.failed)


def _merge_idle(run: _Pass) -> None:
    """Small groups of one topology and task that have not started running merge into larger ones."""
    running = {(a.node_address, a.task_id) for a in run.session.scalars(
        select(AssignmentRow).where(AssignmentRow.state.in_([TaskState.RUNNING.value,
                                                              TaskState.COMPLETED.value])))}
    for task_id, topologies in run.allowed.items():
        for topology in topologies:
            if topology.min_size == topology.max_size:
                continue
            idle = {gid: len(run.members[gid]) for gid, g in run.groups.items()
                    if g.task_id == task_id and g.topology == topology.name
                    and not any((m.node_address, task_id) in running for m in run.members[gid])}
            for a, b in merge_candidates(idle, topology):
                joined = [candidate(run.nodes[m.node_address], run.proven)
                          for m in run.members[a] + run.members[b]]
                for gid in (a, b):
                    run.dissolve(gid, "merged")
                run.changes.merged.append((a, b, run.create(topology.name, joined, task_id)))


def _form_new(run: _Pass, sitting_out: dict[str, set[str]]) -> None:
    """Groups from Healthy ungrouped nodes, for the topologies live tasks ask for, one topology after
    another; a node whose task failed lately joins a topology only if another task wants it."""
    wanted: list[Topology] = []
    for topologies in run.allowed.values():
        wanted += [t for t in topologies if t.name not in {w.name for w in wanted}]
    grouped = {m.node_address for ms in run.members.values() for m in ms}
    # a member with MAX_FAILED failed hardware challenges (wrong, or committed and not opened) is not
    # grouped again (docs/hardware.md): the pool owner decides on chain, the orchestrator on placement
    struck = {a for a, count in failed_counts(run.session).items() if count >= MAX_FAILED}
    free = [candidate(row, run.proven, run.rtt) for row in run.nodes.values()
            if row.state == NodeState.HEALTHY.value and row.address not in grouped | struck]
    measured = placement_links(run.session, free)[0] if wanted and len(free) > 1 else {}
    for topology in wanted:
        users = [tid for tid in run.allowed if topology.name in run.topologies_of(tid)]
        eligible = [c for c in free if any(c.address not in sitting_out.get(tid, ()) for tid in users)]
        # a fresh draw per pass from the OS's random source: nobody predicts it, nobody grinds for it
        room = run.wanted(topology.name)
        proposals = form_groups(eligible, [topology], measured, draw=uuid.uuid4().hex) if room > 0 else []
        for proposal in proposals[: int(min(room, len(proposals)))]:
            gid = run.create(proposal.topology.name, proposal.members, None)
            taken = {m.address for m in proposal.members}
            free = [c for c in free if c.address not in taken]
            run.changes.formed.append(gid)


def _assign_tasks(run: _Pass, sitting_out: dict[str, set[str]]) -> None:
    """Every group without a task gets the live task allowing its topology with the fewest groups, among
    those none of its members sits out; `allowed` is oldest first, so ties go to the oldest."""
    load = {tid: sum(1 for g in run.groups.values() if g.task_id == tid) for tid in run.allowed}
    for gid, group in run.groups.items():
        if group.task_id is not None:
            continue
        addresses = {m.node_address for m in run.members.get(gid, [])}
        fits = [tid for tid in run.allowed if group.topology in run.topologies_of(tid)
                and not addresses & sitting_out.get(tid, set()) and run.room(tid) > 0]
        if fits:
            chosen = min(fits, key=lambda tid: load[tid])
            assign_group(run.session, group, chosen)
            load[chosen] += 1
            run.changes.assigned.append((gid, chosen))


def reconcile(session: Session, configured: dict[str, Topology],
              failed_cooldown_seconds: float = FAILED_COOLDOWN_SECONDS) -> Changes:
    """One pass: dissolve broken groups, merge small idle ones, form new ones, give each a task."""
    allowed, caps = allowed_topologies(session, configured)
    groups = {g.id: g for g in session.scalars(select(NodeGroupRow))}
    if not groups and not allowed:
        # Nothing to dissolve, merge, form or assign. Checked before the node rows are read: that read
        # was ~0.9 s of CPU per pass at 25,000 nodes in pools that use no groups at all.
        return Changes()
    run = _read(session, allowed, caps, groups)
    for gid in list(run.groups):
        reason = _broken(run, gid)
        if reason:
            run.dissolve(gid, reason)
    _merge_idle(run)
    sitting_out = recently_failed(run.failed, failed_cooldown_seconds, utcnow())
    _form_new(run, sitting_out)
    _assign_tasks(run, sitting_out)
    changes = run.changes
    if changes:
        log.info("groups reconciled", dissolved=len(changes.dissolved), formed=len(changes.formed),
                 merged=len(changes.merged), assigned=len(changes.assigned))
    return changes
