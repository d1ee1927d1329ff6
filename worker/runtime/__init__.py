"""Task runtimes: Docker (a real engine) and process (no engine: CI, pods, laptops).

`make_runtime("auto", ...)` picks Docker when an engine answers, else the process runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from worker.runtime.base import Runtime, RuntimeConfig, TaskSetupError, run_name
from worker.runtime.process import ProcessRuntime

if TYPE_CHECKING:
    from worker.bridge import TaskBridge

RuntimeKind = Literal["auto", "docker", "process"]

__all__ = ["ProcessRuntime", "Runtime", "RuntimeConfig", "RuntimeKind", "TaskSetupError", "make_runtime",
           "run_name"]


def make_runtime(kind: RuntimeKind, config: RuntimeConfig, bridge: TaskBridge | None = None) -> Runtime:
    if kind == "process":
        return ProcessRuntime(config, bridge)
    from worker.runtime.docker import DockerRuntime, engine_available

    if kind == "docker" or engine_available():
        return DockerRuntime(config, bridge)
    return ProcessRuntime(config, bridge)
