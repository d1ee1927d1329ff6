"""The trainer's task spec (SYNTHETIC-2 format) and the task records the orchestrator serves."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from intellect.wire.base import WireModel
from intellect.wire.templates import FILE_NAME_VARIABLES, TASK_VARIABLES, check_variables

# Bounds on a task spec: the whole spec rides in every heartbeat reply, so it stays small.
MAX_SPEC_BYTES = 256 * 1024
MAX_ENV_VARS = 256
MAX_ENV_KEY = 256
MAX_ARG_CHARS = 32 * 1024
MAX_ARGS = 1024
MAX_LABELS = 64
MAX_MOUNTS = 32
MAX_PATH_CHARS = 1024
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HEX_KEY = re.compile(r"[0-9a-f]{64}")  # a group's secret, a member's transport secret or public key
NODE = re.compile(r"0x[0-9a-fA-F]{40}")  # a member's node address
# Where the worker puts the task's own directories inside a container: a mount may not shadow them.
RESERVED_CONTAINER_PATHS = ("/data", "/shared", "/run/intellect")


def _no_nul(value: str, where: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{where} contains a NUL byte")
    return value


def _relative_parts(value: str, where: str) -> PurePosixPath:
    path = PurePosixPath(value)
    if ".." in path.parts:
        raise ValueError(f"{where} must not contain '..': {value!r}")
    return path


class VolumeMount(WireModel):
    host_path: str = Field(
        min_length=1,
        max_length=MAX_PATH_CHARS,
        description="resolved under the worker's task storage root (a leading '/' is stripped, as in the "
        "reference); may use task ${VARIABLES}; never '..', never outside the root after templating",
    )
    container_path: str = Field(min_length=1, max_length=MAX_PATH_CHARS)

    @field_validator("host_path")
    @classmethod
    def _under_root(cls, value: str) -> str:
        _no_nul(value, "host_path")
        _relative_parts(value, "host_path")
        check_variables([value], TASK_VARIABLES, "volume_mounts.host_path")
        relative = value.lstrip("/")
        if not relative or relative == ".":
            raise ValueError("host_path names the storage root itself; give a folder under it")
        return relative

    @field_validator("container_path")
    @classmethod
    def _absolute_container_path(cls, value: str) -> str:
        _no_nul(value, "container_path")
        if not value.startswith("/"):
            raise ValueError("container_path must be absolute")
        path = _relative_parts(value, "container_path")
        normal = str(path)
        if normal == "/":
            raise ValueError("container_path '/' would hide the whole image")
        for reserved in RESERVED_CONTAINER_PATHS:
            if normal == reserved or normal.startswith(reserved + "/"):
                raise ValueError(
                    f"container_path {value!r} is reserved: the worker mounts the task's own {reserved} there"
                )
        return value


class NodeGroupsPlugin(WireModel):
    allowed_topologies: list[str] = Field(min_length=1)
    # The most groups the task runs at once (None: as many as the pool's free nodes make). A trainer that
    # wants k pipelines leaves the other nodes free for the pool's single-node tasks.
    # left out of the stored spec when not set: a task body is kept as it was written
    max_groups: int | None = Field(default=None, ge=1, le=10_000, exclude_if=lambda value: value is None)


class SchedulingPlugins(WireModel):
    node_groups: NodeGroupsPlugin | None = None


class SchedulingConfig(WireModel):
    plugins: SchedulingPlugins = Field(default_factory=SchedulingPlugins)


class StorageConfig(WireModel):
    file_name_template: str = Field(min_length=1, max_length=512)

    @field_validator("file_name_template")
    @classmethod
    def _known_variables(cls, value: str) -> str:
        _no_nul(value, "storage_config.file_name_template")
        if value.startswith("/") or "\\" in value:
            raise ValueError("storage_config.file_name_template must be a relative name with '/' separators")
        _relative_parts(value, "storage_config.file_name_template")
        check_variables([value], FILE_NAME_VARIABLES, "storage_config.file_name_template")
        return value


class TaskMetadata(WireModel):
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_LABELS)

    @field_validator("labels")
    @classmethod
    def _bounded(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            if not 0 < len(key) <= 128 or len(text) > 1024:
                raise ValueError(f"label {key[:40]!r}: keys take 1-128 characters, values at most 1024")
            _no_nul(key + text, f"label {key[:40]!r}")
        return value


WORKLOAD_NAME = r"^[a-z][a-z0-9_.-]{0,63}$"
MAX_WORKLOAD_SETTINGS = 128


class WorkloadRef(WireModel):
    """Which workload plug-in the task runs (`intellect.workloads`), and its settings. The orchestrator
    validates the settings with the plug-in when the task is POSTed; validators judge the task's files
    with the same plug-in and settings."""

    type: str = Field(pattern=WORKLOAD_NAME, description="the plug-in's name, e.g. 'inference'")
    settings: dict[str, Any] = Field(
        default_factory=dict, max_length=MAX_WORKLOAD_SETTINGS,
        description="the plug-in's task settings (its docs list them); checked by the plug-in",
    )  # fmt: skip


class TaskSpec(WireModel):
    """What a trainer POSTs. Unknown fields and unknown `${VARS}` are rejected."""

    name: str = Field(min_length=1, max_length=128)
    workload: WorkloadRef | None = None
    image: str = Field(
        "", max_length=512, validate_default=True,
        description="required unless `workload` names a plug-in, which then supplies it",
    )
    env_vars: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV_VARS)
    cmd: list[str] = Field(default_factory=list, max_length=MAX_ARGS)
    entrypoint: list[str] | None = Field(default=None, max_length=MAX_ARGS)
    metadata: TaskMetadata = Field(default_factory=TaskMetadata)
    scheduling_config: SchedulingConfig | None = None
    storage_config: StorageConfig | None = None
    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=MAX_MOUNTS)

    @field_validator("image")
    @classmethod
    def _image_or_workload(cls, value: str, info: ValidationInfo) -> str:
        if not value and info.data.get("workload") is None:
            raise ValueError("give a container image, or a `workload` whose plug-in supplies one")
        return value

    @field_validator("name", "image")
    @classmethod
    def _printable(cls, value: str) -> str:
        if any(ord(c) < 32 for c in value):
            raise ValueError("must not contain control characters")
        return value

    @field_validator("env_vars")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            if len(key) > MAX_ENV_KEY or not ENV_KEY.fullmatch(key):
                raise ValueError(
                    f"env var name {key[:60]!r} is not a valid name: letters, digits and '_', "
                    f"not starting with a digit, at most {MAX_ENV_KEY} characters"
                )
            if len(text) > MAX_ARG_CHARS:
                raise ValueError(f"env var {key} is longer than {MAX_ARG_CHARS} characters")
            _no_nul(text, f"env var {key}")
        return value

    @field_validator("cmd", "entrypoint")
    @classmethod
    def _args(cls, value: list[str] | None) -> list[str] | None:
        for i, arg in enumerate(value or []):
            if len(arg) > MAX_ARG_CHARS:
                raise ValueError(f"argument {i} is longer than {MAX_ARG_CHARS} characters")
            _no_nul(arg, f"argument {i}")
        return value

    @model_validator(mode="after")
    def _known_task_variables(self) -> TaskSpec:
        check_variables(self.env_vars.values(), TASK_VARIABLES, "env_vars")
        check_variables(self.cmd, TASK_VARIABLES, "cmd")
        check_variables(self.entrypoint or [], TASK_VARIABLES, "entrypoint")
        size = len(self.model_dump_json())
        if size > MAX_SPEC_BYTES:
            raise ValueError(f"the task spec is {size} bytes as JSON; at most {MAX_SPEC_BYTES} are accepted")
        return self

    @property
    def allowed_topologies(self) -> list[str]:
        plugins = self.scheduling_config.plugins if self.scheduling_config else None
        return plugins.node_groups.allowed_topologies if plugins and plugins.node_groups else []

    @property
    def max_groups(self) -> int | None:
        plugins = self.scheduling_config.plugins if self.scheduling_config else None
        return plugins.node_groups.max_groups if plugins and plugins.node_groups else None

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
    """A task as the orchestrator stores and serves it. `judged` follows from the stored spec: a task that
    names no workload (and whose program no plug-in claimed when it was POSTed) has files nobody
    judges or pays; `warnings` are what the POST had to say about it."""

    id: str
    spec: TaskSpec
    created_at: datetime
    deleted: bool = False
    judged: bool = Field(True, description="False: no workload judges its files; they are never paid")
    warnings: list[str] = Field(default_factory=list, max_length=16)

    @model_validator(mode="after")
    def _judged_from_spec(self) -> Task:
        self.judged = self.spec.workload is not None
        return self


class GroupContext(WireModel):
    """A node's place in its node group, expanded into `${GROUP_*}` variables."""

    group_id: str
    group_index: int = Field(ge=0)
    group_size: int = Field(ge=1)
    next_p2p_address: str | None = None
    # Members behind NAT (nobody can call them; they joined by fetching their invite): every link of
    # the ring is opened by an end that can be called.
    prev_p2p_address: str | None = Field(
        default=None, description="set when this member is behind NAT: its inbox dials the predecessor's "
        "outbox here (the predecessor's P2P port + 1), rather than listening",
    )  # fmt: skip
    next_dials_in: bool = Field(
        default=False, description="the next member is behind NAT: this member's outbox listens on its "
        "P2P port + 1 and the next member dials it",
    )  # fmt: skip
    topology: str | None = None
    secret: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$",
        description="`${GROUP_SECRET}`: 64 hex characters shared by the group's members alone (derived "
        "by the orchestrator per task and group): it shows a peer is in the group, not which member it "
        "is; None from an orchestrator that derives none",
    )  # fmt: skip
    member_secret: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$",
        description="`${MEMBER_SECRET}`: this member's own transport secret (a CURVE secret key, 64 hex "
        "characters), told to no other member, so no member can speak on a link as another; None from "
        "an orchestrator that derives none",
    )  # fmt: skip
    group_keys: list[str] | None = Field(
        default=None, description="`${GROUP_KEYS}` (comma-separated): every member's transport public key "
        "(the CURVE public key of its member_secret, 64 hex characters), in stage order",
    )  # fmt: skip

    members: list[str] | None = Field(
        default=None, description="`${GROUP_MEMBERS}` (comma-separated): every member's node address, in "
        "stage order, as the orchestrator formed the group: what each member holds the ring's hello round "
        "and the driver's signature over a batch to, so no member can pass on a batch as another's",
    )  # fmt: skip

    @model_validator(mode="after")
    def _one_key_per_member(self) -> GroupContext:
        keys = self.group_keys
        if keys is not None and (len(keys) != self.group_size or not all(HEX_KEY.fullmatch(k) for k in keys)):
            raise ValueError(f"group_keys: one key of 64 lowercase hex characters per member "
                             f"({self.group_size})")
        members = self.members
        if members is not None and (len(members) != self.group_size
                                    or not all(NODE.fullmatch(m) for m in members)):  # fmt: skip
            raise ValueError(f"members: one node address per member ({self.group_size})")
        return self


class AssignedTask(WireModel):
    """The task a node should be running, as handed out in a heartbeat reply."""

    task: Task
    group: GroupContext | None = None
