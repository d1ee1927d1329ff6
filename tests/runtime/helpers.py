"""Helpers for the runtime suite: a harness per runtime kind, a reconcile-until helper.

Docker tests need a real engine and the local test image (`scripts/ci-docker.sh` makes both).
Without them they skip with the reason, unless INTELLECT_REQUIRE_DOCKER=1 (CI), where they fail.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from intellect.wire.heartbeat import TaskStatus
from intellect.wire.tasks import AssignedTask, GroupContext, Task, TaskSpec, TaskState
from tests.support import testing
from worker.runtime import ProcessRuntime, RuntimeBase, RuntimeConfig
from worker.runtime.bridge import TaskBridge

REPO = Path(__file__).resolve().parents[2]
TEST_IMAGE = os.environ.get("INTELLECT_TEST_IMAGE", "intellect-test:latest")
WORKLOAD = REPO / "images" / "test" / "workload.py"


def docker_problem() -> str | None:
    return testing.docker_problem(TEST_IMAGE)


class Harness:
    """Builds runtimes (a new object = a restarted worker) and task specs for one runtime kind."""

    def __init__(self, kind: str, root: Path, bridge: TaskBridge) -> None:
        self.kind, self.root, self.bridge = kind, root, bridge
        self.node = "0x" + secrets.token_hex(20)  # labels scope Docker objects to this test
        self.created: list[RuntimeBase[Any]] = []

    def config(self, **overrides: object) -> RuntimeConfig:
        values: dict[str, object] = {
            "node_address": self.node,
            "storage_root": self.root / "storage",
            "state_dir": self.root / "state",
            "socket_path": self.bridge.socket_path,
            "p2p_seed": "seed-42",
            "max_restarts": 2,
            "restart_delay": 0.1,
            "stop_timeout": 2,
            "pull_retry_seconds": 60,
        }
        return RuntimeConfig(**(values | overrides))

    def runtime(self, **overrides: object) -> RuntimeBase[Any]:
        config = self.config(**overrides)
        if self.kind == "docker":
            from worker.runtime.docker import DockerRuntime

            runtime: RuntimeBase[Any] = DockerRuntime(config, self.bridge)
        else:
            runtime = ProcessRuntime(config, self.bridge)
        self.created.append(runtime)
        return runtime

    def spec(self, *actions: str, image: str = TEST_IMAGE, **fields: object) -> TaskSpec:
        if self.kind == "docker":
            entrypoint = ["python3", "/opt/intellect/workload.py"]
        else:
            entrypoint = [sys.executable, str(WORKLOAD)]
        return TaskSpec(name="test", image=image, entrypoint=entrypoint, cmd=list(actions), **fields)

    def assign(
        self, spec: TaskSpec, task_id: str | None = None, group: GroupContext | None = None
    ) -> AssignedTask:
        task = Task(id=task_id or f"t-{uuid.uuid4().hex[:10]}", spec=spec, created_at=datetime.now(UTC))
        return AssignedTask(task=task, group=group)

    def data_dir(self, desired: AssignedTask) -> Path:
        return self.config().data_dir(desired.task.id)

    def cleanup(self) -> None:
        for runtime in self.created:
            try:
                runtime.apply(None)
            finally:
                runtime.close()


def wait_for(
    runtime: RuntimeBase[Any],
    desired: AssignedTask | None,
    accept: Callable[[TaskStatus], bool],
    timeout: float = 20.0,
) -> TaskStatus:
    """Reconcile in a loop, like the worker does, until the status is accepted."""
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        status = runtime.apply(desired)
        if status is not None and accept(status):
            return status
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s; last status {status}")


def in_state(*states: TaskState) -> Callable[[TaskStatus], bool]:
    return lambda status: status.state in states
