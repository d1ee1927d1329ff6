"""The trainer's task spec (SYNTHETIC-2 format) and the task records the orchestrator serves."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from enum import StrEnum
from pathlib import PurePosixPath

from pydantic import Field, field_validator, model_validator

from intellect.wire.base import WireModel
from intellect.wire.templates import FILE_NAME_VARIABLES, TASK_VARIABLES, check_variables


class VolumeMount(WireModel):
    host_path: str = Field(description="relative to the worker's storage root; never an absolute host path")
    container_path: str

    @field_validator("host_path")
    @classmethod
    def _no_escape(cls, value: str) -> str:
        path = PurePosixPath(value)
        if path.is_absolute() or ".." in path.parts:
            raise ValueError("host_path must be relative to the worker's storage root, without '..'")
        return value

    @field_validator("container_path")
    @classmethod
    def _absolute_container_path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("container_path must be absolute")
        return value


class NodeGroupsPlugin(WireModel):
    allowed_topologies: list[str] = Field(min_length=1)


class SchedulingPlugins(WireModel):
    node_groups: NodeGroupsPlugin | None = None


class SchedulingConfig(WireModel):
    plugins: SchedulingPlugins = Field(default_factory=SchedulingPlugins)


class StorageConfig(WireModel):
    file_name_template: str = Field(min_length=1, max_length=512)

    @field_validator("file_name_template")
    @classmethod
    def _known_variables(cls, value: str) -> str:
        check_variables([value], FILE_NAME_VARIABLES, "storage_config.file_name_template")
        return value


class TaskMetadata(WireModel):
    labels: dict[str, str] = Field(default_factory=dict)


class TaskSpec(WireModel):
    """What a trainer POSTs. Unknown fields and unknown `${VARS}` are rejected."""

    name: str = Field(min_length=1, max_length=128)
    image: str = Field(min_length=1, max_length=512)
    env_vars: dict[str, str] = Field(default_factory=dict)
    cmd: list[str] = Field(default_factory=list)
    entrypoint: list[str] | None = None
    metadata: TaskMetadata = Field(default_factory=TaskMetadata)
    scheduling_config: SchedulingConfig | None = None
    storage_config: StorageConfig | None = None
    volume_mounts: list[VolumeMount] = Field(default_factory=list)

    @model_validator(mode="after")
    def _known_task_variables(self) -> TaskSpec:
        check_variables(self.env_vars.values(), TASK_VARIABLES, "env_vars")
        check_variables(self.cmd, TASK_VARIABLES, "cmd")
        check_variables(self.entrypoint or [], TASK_VARIABLES, "entrypoint")
        return self

    @property
    def allowed_topologies(self) -> list[str]:
        plugins = self.scheduling_config.plugins if self.scheduling_config else None
        return plugins.node_groups.allowed_topologies if plugins and plugins.node_groups else []

    def config_hash(self) -> str:
        """Stable hash of the effective config: a changed spec means a new container."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


class TaskState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    RESTARTING = "restarting"
    UNKNOWN = "unknown"


class Task(WireModel):
    """A task as the orchestrator stores and serves it."""

    id: str
    spec: TaskSpec
    created_at: datetime
    deleted: bool = False


class GroupContext(WireModel):
    """A node's place in its node group, expanded into `${GROUP_*}` variables."""

    group_id: str
    group_index: int = Field(ge=0)
    group_size: int = Field(ge=1)
    next_p2p_address: str | None = None
    topology: str | None = None


class AssignedTask(WireModel):
    """The task a node should be running, as handed out in a heartbeat reply."""

    task: Task
    group: GroupContext | None = None
