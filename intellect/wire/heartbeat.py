"""Heartbeats (worker → orchestrator, signed by the node key) and the orchestrator's reply."""

from __future__ import annotations

from pydantic import Field

from intellect.wire.base import WireModel
from intellect.wire.tasks import AssignedTask, TaskState


class TaskStatus(WireModel):
    task_id: str
    state: TaskState
    config_hash: str | None = None
    detail: str | None = Field(default=None, max_length=4096, description="error or container status")
    exit_code: int | None = None


class HeartbeatRequest(WireModel):
    """No address field: the node is whoever signed the request."""

    task: TaskStatus | None = None
    metrics: dict[str, float] = Field(default_factory=dict, description="label → value, from the task bridge")
    worker_version: str | None = None
    leaving: bool = Field(default=False, description="the worker is shutting down (SIGTERM)")


class HeartbeatResponse(WireModel):
    current_task: AssignedTask | None = None
    interval_seconds: float = 10.0
