"""What the heartbeat reports when the runtime cannot start the desired task."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from intellect.identity import Wallet
from intellect.wire.heartbeat import TaskStatus
from intellect.wire.tasks import AssignedTask, Task, TaskSpec, TaskState
from worker.heartbeat import Heartbeater
from worker.runtime.recording import RecordingRuntime


class BrokenRuntime(RecordingRuntime):
    """A runtime whose start fails with an unexpected error (not a transient engine problem)."""

    def apply(self, desired: AssignedTask | None) -> TaskStatus | None:
        if desired is not None and desired.task.id == "new":
            raise RuntimeError("cannot mount /data: permission denied")
        return super().apply(desired)


def assigned(task_id: str) -> AssignedTask:
    spec = TaskSpec(name=task_id, image="python:3.11-slim", cmd=["true"])
    return AssignedTask(task=Task(id=task_id, spec=spec, created_at=datetime.now(UTC)))


def test_a_task_that_cannot_start_is_reported_failed_with_the_reason() -> None:
    beater = Heartbeater(Wallet.create(), BrokenRuntime(), interval=1, timeout=1)
    old = asyncio.run(beater.apply(assigned("old")))
    assert old is not None and old.task_id == "old" and old.state == TaskState.RUNNING
    beater.status = old
    new = asyncio.run(beater.apply(assigned("new")))
    assert new is not None and new.task_id == "new"  # not the previous task's status
    assert new.state == TaskState.FAILED and "permission denied" in (new.detail or "")
    assert asyncio.run(beater.apply(None)) is None
