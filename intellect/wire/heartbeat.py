"""Heartbeats (worker → orchestrator, signed by the node key) and the orchestrator's reply."""

from __future__ import annotations

import math

from pydantic import Field, field_validator

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
    metrics: dict[str, float] = Field(
        default_factory=dict, max_length=256, description="label → value from the task bridge, finite"
    )
    worker_version: str | None = None
    leaving: bool = Field(default=False, description="the worker is shutting down (SIGTERM)")

    @field_validator("metrics")
    @classmethod
    def _finite(cls, value: dict[str, float]) -> dict[str, float]:
        for label, number in value.items():
            if len(label) > 128:
                raise ValueError(f"metric label {label[:40]!r}… is longer than 128 characters")
            if not math.isfinite(number):
                raise ValueError(f"metric {label!r} is {number}; only finite numbers are accepted")
        return value


class HeartbeatResponse(WireModel):
    current_task: AssignedTask | None = None
    interval_seconds: float = 10.0
