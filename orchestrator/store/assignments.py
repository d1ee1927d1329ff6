"""`AssignmentStore`: the only writer of `assignments`, each node's reported progress on each task.

Why a row per (task, node) rather than per heartbeat: the heartbeat path hands a report here only when
it differs from the node's previous one (compared in Redis by the beat's one script), so SQL is written
once per change of state, not 2,000 times a second. What reads the rows: the group keeper, for the
members whose task failed for good (`orchestrator/groups/failures.py`, inside its own transaction),
and the upload grant, through `worked_on`, for files a node made on a task it no longer holds.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from intellect.wire.heartbeat import TaskStatus
from intellect.wire.tasks import Task
from orchestrator.models import AssignmentRow, TaskRow, utcnow
from orchestrator.scheduling import task_from_row


class AssignmentStore:
    """Sync methods: the heartbeat runs `record` in a thread, off its hot path."""

    def __init__(self, sessions: Callable[[], Session]) -> None:
        self.sessions = sessions

    def record(self, address: str, status: TaskStatus) -> None:
        """Upsert the node's row for the task it reports, stamped now. A task this orchestrator never
        issued (or purged long ago) is not recorded: a node must not create rows by naming ids."""
        with self.sessions() as session, session.begin():
            row = session.scalars(select(AssignmentRow).where(
                AssignmentRow.task_id == status.task_id, AssignmentRow.node_address == address)).first()
            if row is None:
                if session.get(TaskRow, status.task_id) is None:
                    return
                row = AssignmentRow(task_id=status.task_id, node_address=address, assigned_at=utcnow())
                session.add(row)
            row.state, row.detail, row.updated_at = status.state.value, status.detail, utcnow()

    def worked_on(self, address: str, task_id: str, grace: timedelta) -> Task | None:
        """The task, when `address` reported working on it and the task is live or was deleted less than
        `grace` ago (and the report came before the deletion); None otherwise. Files are made before
        they are uploaded: the upload grant asks this for a node no longer assigned the task."""
        with self.sessions() as session:
            task = session.get(TaskRow, task_id)
            if task is None or (task.deleted_at is not None and utcnow() - task.deleted_at > grace):
                return None
            worked = select(AssignmentRow.id).where(AssignmentRow.task_id == task_id,
                                                    AssignmentRow.node_address == address)  # fmt: skip
            if task.deleted_at is not None:
                worked = worked.where(AssignmentRow.assigned_at <= task.deleted_at)
            return task_from_row(task) if session.scalars(worked).first() is not None else None
