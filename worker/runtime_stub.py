"""A runtime that only records the desired task and reports it as running (issue 3's stand-in).

The real runtimes (Docker, process) live in `worker.runtime`; they share this interface:
`apply(desired) -> TaskStatus | None`, `logs(tail)`, `restart()`.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from intellect.wire.heartbeat import TaskStatus
from intellect.wire.tasks import AssignedTask, TaskState


class RecordingRuntime:
    def __init__(self) -> None:
        self.desired: AssignedTask | None = None
        self.restarts = 0
        self._log: list[str] = []
        self._lock = threading.Lock()

    def _note(self, line: str) -> None:
        self._log.append(f"{datetime.now(UTC).isoformat(timespec='seconds')} {line}")
        del self._log[:-1000]

    def apply(self, desired: AssignedTask | None) -> TaskStatus | None:
        with self._lock:
            before = self.desired.task.id if self.desired else None
            after = desired.task.id if desired else None
            if before != after:
                self._note(f"task {before} -> {after}")
            self.desired = desired
            if desired is None:
                return None
            return TaskStatus(task_id=desired.task.id, state=TaskState.RUNNING,
                              config_hash=desired.task.spec.config_hash(), detail="recorded (no runtime)")

    def logs(self, tail: int = 100) -> list[str]:
        with self._lock:
            return self._log[-tail:] if tail > 0 else []

    def restart(self) -> None:
        with self._lock:
            self.restarts += 1
            self._note("restart requested")
