"""Which task each node should run. The heartbeat path asks a cached `Plan`; SQL is read only on change.

`Scheduler.plan(session)` builds a Plan from SQL. The one in use is `GroupScheduler`
(orchestrator/groups/scheduler.py): grouped nodes get their group's task with a GroupContext, the
others the newest live task that asks for no groups. Tests may pass their own Scheduler to create_app.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC
from typing import Protocol

from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from intellect.wire.tasks import AssignedTask, Task, TaskSpec
from orchestrator.models import TaskRow


def task_from_row(row: TaskRow) -> Task:
    return Task(id=row.id, spec=TaskSpec.model_validate(row.spec),
                created_at=row.created_at.replace(tzinfo=UTC), deleted=row.deleted_at is not None)


class Plan(Protocol):
    def task_for(self, node_address: str) -> AssignedTask | None: ...


class Scheduler(Protocol):
    def plan(self, session: Session) -> Plan: ...


class SameTaskPlan:
    def __init__(self, assigned: AssignedTask | None) -> None:
        self.assigned = assigned

    def task_for(self, node_address: str) -> AssignedTask | None:
        return self.assigned


class PlanCache:
    """The current Plan, rebuilt only when the shared version counter in Redis moves."""

    def __init__(self, scheduler: Scheduler, sessions: Callable[[], Session]) -> None:
        self.scheduler = scheduler
        self.sessions = sessions
        self.version: int | None = None
        self.plan: Plan = SameTaskPlan(None)
        self._lock = asyncio.Lock()

    def _build(self) -> Plan:
        with self.sessions() as session:
            return self.scheduler.plan(session)

    async def current(self, version: int) -> Plan:
        if version == self.version:
            return self.plan
        async with self._lock:
            if version != self.version:
                self.plan = await run_in_threadpool(self._build)
                self.version = version
        return self.plan
