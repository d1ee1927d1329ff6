"""A runtime that only records the desired task and reports it as running (no execution).

For a worker that must answer invites and heartbeat without running anything (tests, dry runs):
it implements the `Runtime` protocol with no bridge, so no files are uploaded.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from intellect.wire.heartbeat import TaskStatus
from intellect.wire.tasks import AssignedTask, TaskState
from worker.runtime.bridge import TaskBridge


class RecordingRuntime:
    bridge: TaskBridge | None = None

    def __init__(self) -> None:
        self.desired: AssignedTask | None = None
        self.restarts = 0
        self._log: list[str] = []
        self._lock = threading.Lock()

    def _note(self, line: str) -> None:
        self._log.append(f"{datetime.now(UTC).isoformat(timespec='seconds')} {line}")
        del self._log[:-1000]

    def _recorded(self) -> TaskStatus | None:
        if self.desired is None:
            return None
        return TaskStatus(task_id=self.desired.task.id, state=TaskState.RUNNING,
                          config_hash=self.desired.task.spec.config_hash(), detail="recorded (no runtime)")

    def apply(self, desired: AssignedTask | None) -> TaskStatus | None:
        with self._lock:
            before = self.desired.task.id if self.desired else None
            after = desired.task.id if desired else None
            if before != after:
                self._note(f"task {before} -> {after}")
            self.desired = desired
            return self._recorded()

    def status(self) -> TaskStatus | None:
        with self._lock:
            return self._recorded()

    def logs(self, tail: int = 100) -> list[str]:
        with self._lock:
            return self._log[-tail:] if tail > 0 else []

    def restart(self) -> TaskStatus | None:
        with self._lock:
            self.restarts += 1
            self._note("restart requested")
            return self._recorded()

    def adopt(self) -> TaskStatus | None:
        return None  # nothing ran, so nothing outlives a worker process

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        return None
