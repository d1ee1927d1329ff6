"""Node groups in SQL (`node_groups`, `group_members`): the only writer and the API's read.

The group keeper's pass (`orchestrator/groups/reconcile.py`) decides which groups go, form and take
which task; the rows change here, each change with its audit row. The writers take the keeper's session
because a pass is one transaction: a pass that fails half way leaves the groups as they were, and every
replica rebuilds its plan from a consistent state. What a group is for the scheduler (the ring order,
who may join) is decided before these are called.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from intellect.wire.admin import GroupRecord
from orchestrator.models import GroupMemberRow, NodeGroupRow, utcnow
from orchestrator.store.nodes import audit


@dataclass(frozen=True)
class Seat:
    """A member's place in a new group: its stage `position` in the ring and its peer inbox."""

    address: str
    position: int
    p2p_address: str | None


def form_group(session: Session, group_id: str, topology: str, seats: list[Seat],
               task_id: str | None) -> tuple[NodeGroupRow, list[GroupMemberRow]]:  # fmt: skip
    """Add the group and its members; returns them, the members in ring order. The audit row lists the
    members in the order given (as formation proposed them)."""
    group = NodeGroupRow(id=group_id, topology=topology, task_id=task_id, created_at=utcnow())
    session.add(group)
    session.flush()  # the group row first: members reference it
    rows = [GroupMemberRow(node_address=s.address, group_id=group_id, position=s.position,
                           p2p_address=s.p2p_address) for s in seats]  # fmt: skip
    session.add_all(rows)
    audit(session, "groups", "group_formed", group_id, topology=topology, task=task_id,
          members=[s.address for s in seats])
    return group, sorted(rows, key=lambda row: row.position)


def dissolve_group(session: Session, group: NodeGroupRow, reason: str) -> None:
    """Remove the group and its members (the nodes are free for the next formation)."""
    session.execute(delete(GroupMemberRow).where(GroupMemberRow.group_id == group.id))
    session.delete(group)
    audit(session, "groups", "group_dissolved", group.id, reason=reason, task=group.task_id)


def assign_group(session: Session, group: NodeGroupRow, task_id: str) -> None:
    """Give a group without a task the task it is to run."""
    group.task_id = task_id
    audit(session, "groups", "group_assigned", group.id, task=task_id)


def list_groups(sessions: sessionmaker[Session]) -> list[GroupRecord]:
    with sessions() as session:
        groups = session.scalars(select(NodeGroupRow).order_by(NodeGroupRow.created_at)).all()
        members = session.scalars(select(GroupMemberRow).order_by(GroupMemberRow.position)).all()
        by_group: dict[str, list[str]] = {}
        for member in members:
            by_group.setdefault(member.group_id, []).append(member.node_address)
        return [
            GroupRecord(id=g.id, topology=g.topology, task_id=g.task_id, nodes=by_group.get(g.id, []),
                        created_at=g.created_at)
            for g in groups
        ]
