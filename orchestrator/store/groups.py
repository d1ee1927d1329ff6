"""Reads of the node groups (`node_groups`, `group_members`); the group keeper
(orchestrator/groups/reconcile.py) is their only writer."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from intellect.wire.admin import GroupRecord
from orchestrator.models import GroupMemberRow, NodeGroupRow


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
