"""Group bookkeeping in SQL: dissolve broken groups, merge small idle ones, form new ones, give each a task.

`reconcile(session, topologies)` is one pass in one transaction; it returns what it changed so the
caller bumps the plan version (every replica then rebuilds its Plan). Only the leader runs it.
A member whose task failed for good breaks its group like a dead one, and its node sits out that task
for a cooldown (`orchestrator/groups/failures.py` says why).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import structlog
from pydantic import ValidationError
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from intellect.wire.nodes import ComputeSpecs, NodeMetadata, NodeState
from intellect.wire.tasks import TaskSpec, TaskState
from orchestrator.groups.failures import (
    FAILED_COOLDOWN_SECONDS,
    failed_assignments,
    failed_members,
    recently_failed,
)
from orchestrator.groups.formation import Candidate, form_groups, merge_candidates, ring_order
from orchestrator.groups.nearness import trusted_links
from orchestrator.groups.topology import Topology, parse_topology_name
from orchestrator.models import AssignmentRow, GroupMemberRow, NodeGroupRow, NodeRow, TaskRow, utcnow
from orchestrator.store.hardware import MAX_FAILED, PROVEN, failed_counts, latest_proofs
from orchestrator.store.nodes import audit
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


def _dissolve(session: Session, group: NodeGroupRow, reason: str, changes: Changes) -> None:
    session.execute(delete(GroupMemberRow).where(GroupMemberRow.group_id == group.id))
    session.delete(group)
    audit(session, "groups", "group_dissolved", group.id, reason=reason, task=group.task_id)
    log.info("group dissolved", group=group.id, reason=reason)
    changes.dissolved.append((group.id, reason))


def _create(session: Session, topology: str, members: list[Candidate], task_id: str | None) -> NodeGroupRow:
    gid = str(uuid.uuid4())
    group = NodeGroupRow(id=gid, topology=topology, task_id=task_id, created_at=utcnow())
    session.add(group)
    session.flush()  # the group row first: members reference it
    for position, member in enumerate(ring_order(members, draw=gid)):
        session.add(GroupMemberRow(node_address=member.address, group_id=gid, position=position,
                                   p2p_address=member.p2p_address))
    audit(session, "groups", "group_formed", gid, topology=topology, task=task_id,
          members=[m.address for m in members])
    return group


def reconcile(session: Session, configured: dict[str, Topology],
              failed_cooldown_seconds: float = FAILED_COOLDOWN_SECONDS) -> Changes:
    changes = Changes()
    tasks = list(session.scalars(select(TaskRow).where(TaskRow.deleted_at.is_(None))
                                 .order_by(TaskRow.created_at)))
    allowed: dict[str, list[Topology]] = {}
    for task in tasks:
        names = TaskSpec.model_validate(task.spec).allowed_topologies
        resolved = []
        for name in names:
            try:
                resolved.append(resolve_topology(name, configured))
            except UnknownTopology as exc:  # settings changed since the task was accepted
                log.warning("task topology unusable", task=task.id, error=str(exc))
        if names:
            allowed[task.id] = resolved
    groups = {g.id: g for g in session.scalars(select(NodeGroupRow))}
    if not groups and not allowed:
        # Nothing to dissolve, merge, form or assign. Checked before the node rows are read: that read
        # was ~0.9 s of CPU per pass at 25,000 nodes in pools that use no groups at all.
        return changes
    nodes = {row.address: row for row in session.scalars(select(NodeRow))}
    latest = latest_proofs(session)
    proven = {a: p.flops for a, p in latest.items() if p.outcome == PROVEN and p.flops is not None}
    rtt = {a: p.rtt_ms for a, p in latest.items() if p.rtt_ms is not None}
    members: dict[str, list[GroupMemberRow]] = {gid: [] for gid in groups}
    for member in session.scalars(select(GroupMemberRow).order_by(GroupMemberRow.position)):
        members.setdefault(member.group_id, []).append(member)

    failed = failed_assignments(session, allowed)
    # 1. dissolve: a member died (or left the books) or its task failed for good, or the group's task is
    #    gone / no longer fits it
    for gid, group in list(groups.items()):
        bad = [m.node_address for m in members[gid]
               if m.node_address not in nodes or nodes[m.node_address].state not in MEMBER_OK]
        reason = None
        if bad:
            states = ", ".join(f"{a} {nodes[a].state if a in nodes else 'unknown'}" for a in bad)
            reason = f"member lost: {states}"
        elif group.task_id is None and not any(group.topology in {t.name for t in tops}
                                               for tops in allowed.values()):
            reason = f"no live task asks for topology {group.topology}"
        elif group.task_id is not None and group.task_id not in allowed:
            reason = f"task {group.task_id} was deleted"
        elif group.task_id is not None and group.topology not in {t.name for t in allowed[group.task_id]}:
            reason = f"task {group.task_id} no longer allows topology {group.topology}"
        else:
            reason = failed_members(group, members[gid], failed)
        if reason:
            _dissolve(session, group, reason, changes)
            del groups[gid]
            members.pop(gid)

    # 2. merge small groups of one topology and task that have not started running yet
    running = {(a.node_address, a.task_id) for a in session.scalars(
        select(AssignmentRow).where(AssignmentRow.state.in_([TaskState.RUNNING.value,
                                                              TaskState.COMPLETED.value])))}
    for task_id, topologies in allowed.items():
        for topology in topologies:
            if topology.min_size == topology.max_size:
                continue
            idle = {gid: len(members[gid]) for gid, g in groups.items()
                    if g.task_id == task_id and g.topology == topology.name
                    and not any((m.node_address, task_id) in running for m in members[gid])}
            for a, b in merge_candidates(idle, topology):
                joined = [candidate(nodes[m.node_address], proven) for m in members[a] + members[b]]
                for gid in (a, b):
                    _dissolve(session, groups.pop(gid), "merged", changes)
                    members.pop(gid)
                merged = _create(session, topology.name, joined, task_id)
                new = merged.id
                changes.merged.append((a, b, new))
                groups[new] = merged
                members[new] = list(session.scalars(select(GroupMemberRow).where(
                    GroupMemberRow.group_id == new).order_by(GroupMemberRow.position)))

    # 3. form groups from Healthy ungrouped nodes, for the topologies live tasks ask for, one topology
    #    after another; a node whose task failed lately joins a topology only if another task wants it
    wanted: list[Topology] = []
    for topologies in allowed.values():
        wanted += [t for t in topologies if t.name not in {w.name for w in wanted}]
    sitting_out = recently_failed(failed, failed_cooldown_seconds, utcnow())
    grouped = {m.node_address for ms in members.values() for m in ms}
    # a member with MAX_FAILED failed hardware challenges (wrong, or committed and not opened) is not
    # grouped again (docs/hardware.md): the pool owner decides on chain, the orchestrator on placement
    struck = {a for a, count in failed_counts(session).items() if count >= MAX_FAILED}
    free = [candidate(row, proven, rtt) for row in nodes.values()
            if row.state == NodeState.HEALTHY.value and row.address not in grouped | struck]
    addresses = {gid: {m.node_address for m in ms} for gid, ms in members.items()}
    measured = placement_links(session, free)[0] if wanted and len(free) > 1 else {}
    for topology in wanted:
        users = [tid for tid, tops in allowed.items() if topology.name in {t.name for t in tops}]
        eligible = [c for c in free if any(c.address not in sitting_out.get(tid, ()) for tid in users)]
        # a fresh draw per pass from the OS's random source: nobody predicts it, nobody grinds for it
        for proposal in form_groups(eligible, [topology], measured, draw=uuid.uuid4().hex):
            formed = _create(session, proposal.topology.name, proposal.members, None)
            gid = formed.id
            groups[gid] = formed
            addresses[gid] = {m.address for m in proposal.members}
            free = [c for c in free if c.address not in addresses[gid]]
            changes.formed.append(gid)

    # 4. every group without a task gets the live task allowing its topology with the fewest groups,
    #    among those none of its members sits out
    load = {tid: sum(1 for g in groups.values() if g.task_id == tid) for tid in allowed}
    for gid, group in groups.items():
        if group.task_id is not None:
            continue
        fits = [tid for tid, tops in allowed.items() if group.topology in {t.name for t in tops}
                and not addresses.get(gid, set()) & sitting_out.get(tid, set())]
        if fits:
            chosen = min(fits, key=lambda tid: load[tid])  # `allowed` is oldest first: ties go to the oldest
            group.task_id = chosen
            load[chosen] += 1
            audit(session, "groups", "group_assigned", gid, task=chosen)
            changes.assigned.append((gid, chosen))
    if changes:
        log.info("groups reconciled", dissolved=len(changes.dissolved), formed=len(changes.formed),
                 merged=len(changes.merged), assigned=len(changes.assigned))
    return changes
