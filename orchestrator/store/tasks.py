"""`TaskStore`: the only writer of the `tasks` table (create, soft delete) and its admin reads.

Why one place: a task write is never just a row. Every replica caches the per-node plan built from the
live tasks (`PlanCache`), so each create or delete must also move the shared task version and wake
the group keeper; doing that here, after the transaction commits, means no caller can forget it.
The store knows nothing of Redis or HTTP: the follow-up is the `on_change` callback given by the
server, and a missing task is `TaskNotFound`, which the route turns into its 404.

Readers that build plans or groups (`GroupScheduler.plan`, `groups.reconcile`) read `TaskRow` inside
their own session and transaction on purpose and are left there.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select
from sqlalchemy.orm import Session

from intellect.wire.tasks import Task, TaskSpec
from orchestrator.models import TaskRow, utcnow
from orchestrator.scheduling import task_from_row
from orchestrator.store.nodes import audit

OnChange = Callable[[], Awaitable[object]]
# Aliases because the class has a `list` method: inside its body `list[...]` would name the method.
TaskList = list[Task]
TaskRows = list[TaskRow]


class TaskNotFound(LookupError):
    """No task with this id (deleted tasks are still found: deletion is a mark, not a removal)."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"no task {task_id}")
        self.task_id = task_id


class TaskStore:
    """Tasks in SQL. Methods are async and run their SQL in a thread, like every other SQL path of the
    service, so routes and loops can await them directly."""

    def __init__(self, sessions: Callable[[], Session], on_change: OnChange | None = None) -> None:
        self.sessions = sessions
        self.on_change = on_change

    async def _changed(self) -> None:
        if self.on_change is not None:
            await self.on_change()

    # ---- writes ----

    def _insert(self, spec: TaskSpec, actor: str) -> TaskRow:
        with self.sessions() as session, session.begin():
            row = TaskRow(id=str(uuid.uuid4()), name=spec.name, spec=spec.model_dump(mode="json"),
                          config_hash=spec.config_hash(), created_at=utcnow())
            session.add(row)
            audit(session, actor, "task_created", row.id, name=spec.name)
            return row

    async def create(self, spec: TaskSpec, actor: str = "admin") -> Task:
        """Store a new task (already validated) and tell the replicas; returns it as the API shows it."""
        row = await run_in_threadpool(self._insert, spec, actor)
        await self._changed()
        return task_from_row(row)

    def _mark_deleted(self, task_id: str, actor: str) -> TaskRow:
        with self.sessions() as session, session.begin():
            row = session.get(TaskRow, task_id)
            if row is None:
                raise TaskNotFound(task_id)
            if row.deleted_at is None:
                row.deleted_at = utcnow()
                audit(session, actor, "task_deleted", task_id)
            return row

    async def delete(self, task_id: str, actor: str = "admin") -> Task:
        """Mark the task deleted (idempotent: a second delete changes nothing but still answers it)."""
        row = await run_in_threadpool(self._mark_deleted, task_id, actor)
        await self._changed()
        return task_from_row(row)

    # ---- reads ----

    def _load(self, task_id: str) -> TaskRow:
        with self.sessions() as session:
            row = session.get(TaskRow, task_id)
        if row is None:
            raise TaskNotFound(task_id)
        return row

    async def get(self, task_id: str) -> Task:
        return task_from_row(await run_in_threadpool(self._load, task_id))

    def _rows(self, include_deleted: bool) -> TaskRows:
        with self.sessions() as session:
            query = select(TaskRow).order_by(TaskRow.created_at)
            if not include_deleted:
                query = query.where(TaskRow.deleted_at.is_(None))
            return list(session.scalars(query))

    async def list(self, include_deleted: bool = False) -> TaskList:
        """Oldest first; deleted tasks only when asked for."""
        return [task_from_row(r) for r in await run_in_threadpool(self._rows, include_deleted)]

    def count_live(self) -> int:
        """Tasks not deleted (sync: the liveness loop calls it in a thread for its gauge)."""
        with self.sessions() as session:
            return len(session.scalars(select(TaskRow.id).where(TaskRow.deleted_at.is_(None))).all())
