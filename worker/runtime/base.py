"""The runtime interface and what both runtimes share: config, naming, templating, directories.

A runtime turns the desired task (from the heartbeat reply) into running work and reports its
state. `apply` is a reconcile step: called every loop with the same input it does nothing new.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

from pydantic import BaseModel, ConfigDict, Field

from intellect.wire.heartbeat import TaskStatus
from intellect.wire.tasks import AssignedTask, TaskState
from intellect.wire.templates import UnknownTemplateVariable, expand

if TYPE_CHECKING:
    from worker.bridge import TaskBridge

log = logging.getLogger(__name__)

# Labels (Docker) and run-record fields (process) that mark what a runtime owns.
LABEL_MANAGED = "org.intellect.managed"
LABEL_NODE = "org.intellect.node"
LABEL_TASK = "org.intellect.task_id"
LABEL_CONFIG = "org.intellect.config_hash"
LABEL_EFFECTIVE = "org.intellect.effective_hash"

# Where a task sees its directories inside a container.
CONTAINER_DATA = "/data"
CONTAINER_SHARED = "/shared"
CONTAINER_SOCKET_DIR = "/run/intellect"


class RuntimeConfig(BaseModel):
    """Everything a runtime needs from the worker; paths are on the worker's host."""

    model_config = ConfigDict(extra="forbid")

    node_address: str
    storage_root: Path = Field(description="tasks' data dirs, the shared dir and volume mounts live here")
    state_dir: Path = Field(description="the runtime's own records (process run dirs, logs)")
    socket_path: Path | None = Field(default=None, description="the task bridge's unix socket")
    p2p_seed: str | None = Field(default=None, description="value of ${WORKER_P2P_SEED}")
    max_restarts: int = Field(default=3, ge=0, description="restarts after a failure before 'failed'")
    restart_delay: float = Field(default=1.0, ge=0, description="first restart back-off (process runtime)")
    shm_size: str = Field(default="1g", description="/dev/shm size of a container")
    gpu_ids: list[str] = Field(default_factory=list, description="detected GPUs handed to the task")
    stop_timeout: float = Field(default=10.0, ge=0, description="SIGTERM → SIGKILL grace period")
    pull_retry_seconds: float = Field(default=30.0, ge=0, description="wait before re-trying a failed pull")

    @property
    def shared_dir(self) -> Path:
        return self.storage_root / "shared"

    def task_dir(self, task_id: str) -> Path:
        return self.storage_root / "tasks" / safe_name(task_id)

    def data_dir(self, task_id: str) -> Path:
        return self.task_dir(task_id) / "data"


class TaskSetupError(ValueError):
    """The task cannot be started as specified (a template or mount problem): its state is failed."""


def safe_name(text: str, limit: int = 64) -> str:
    """A name usable for containers and directories: [A-Za-z0-9_.-], no leading dot or dash."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", text).lstrip(".-") or "task"
    if cleaned != text or len(cleaned) > limit:
        # Keep distinct ids distinct after cleaning.
        cleaned = cleaned[: limit - 9] + "-" + hashlib.sha256(text.encode()).hexdigest()[:8]
    return cleaned


def effective_hash(desired: AssignedTask) -> str:
    """The spec's config hash, plus the node-group placement: either changing replaces the container."""
    spec_hash = desired.task.spec.config_hash()
    if desired.group is None:
        return spec_hash
    blob = json.dumps(desired.group.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256((spec_hash + blob).encode()).hexdigest()[:12]


def run_name(desired: AssignedTask) -> str:
    return f"intellect-{safe_name(desired.task.id, 48)}-{effective_hash(desired)}"


def template_values(desired: AssignedTask, config: RuntimeConfig, socket_path: str | None) -> dict[str, str]:
    """Values for `${VAR}`. Missing ones (no group, no seed, no socket) stay missing: using them is an
    error in the task's state rather than a silent empty string."""
    values = {
        "TASK_ID": desired.task.id,
        "NODE_ADDRESS": config.node_address,
        "TIMESTAMP": str(int(time.time())),
    }
    if desired.group is not None:
        values |= {
            "GROUP_ID": desired.group.group_id,
            "GROUP_INDEX": str(desired.group.group_index),
            "GROUP_SIZE": str(desired.group.group_size),
        }
        if desired.group.next_p2p_address is not None:
            values["NEXT_P2P_ADDRESS"] = desired.group.next_p2p_address
    if config.p2p_seed is not None:
        values["WORKER_P2P_SEED"] = config.p2p_seed
    if socket_path is not None:
        values["SOCKET_PATH"] = socket_path
    return values


class PreparedTask(BaseModel):
    """A spec with every template expanded and every host path resolved and checked."""

    name: str
    task_id: str
    config_hash: str
    effective_hash: str
    image: str
    entrypoint: list[str] | None
    cmd: list[str]
    env: dict[str, str]
    data_dir: Path
    shared_dir: Path
    mounts: list[tuple[Path, str]] = Field(description="(host dir under storage root, container path)")


def resolve_mounts(desired: AssignedTask, config: RuntimeConfig) -> list[tuple[Path, str]]:
    """Map each `volume_mounts` host_path under `<storage_root>/volumes`, re-checked on resolved paths
    (the wire model already refuses absolute paths and '..'; a symlink could still point outside)."""
    root = (config.storage_root / "volumes").resolve()
    mounts = []
    for mount in desired.task.spec.volume_mounts:
        host = (root / mount.host_path).resolve()
        if host != root and root not in host.parents:
            raise TaskSetupError(
                f"volume_mounts host_path {mount.host_path!r} resolves to {host}, outside the worker's "
                f"storage root {root}"
            )
        if mount.container_path.rstrip("/") in ("", CONTAINER_DATA, CONTAINER_SHARED, CONTAINER_SOCKET_DIR):
            raise TaskSetupError(f"volume_mounts container_path {mount.container_path!r} is reserved")
        mounts.append((host, mount.container_path))
    return mounts


def prepare(
    desired: AssignedTask,
    config: RuntimeConfig,
    socket_path: str | None,
    data_dir_env: str,
    translate: Callable[[str], str] | None = None,
) -> PreparedTask:
    """Expand templates and resolve mounts; raise TaskSetupError naming the problem.

    `translate` rewrites the spec's own strings before expansion (the process runtime maps container
    paths to host dirs there, so expanded values such as the socket path are never rewritten)."""
    spec = desired.task.spec
    values = template_values(desired, config, socket_path)
    mapped = translate or (lambda text: text)
    try:
        env = {key: expand(mapped(value), values) for key, value in spec.env_vars.items()}
        cmd = [expand(mapped(arg), values) for arg in spec.cmd]
        entrypoint = [expand(mapped(arg), values) for arg in spec.entrypoint] if spec.entrypoint else None
    except UnknownTemplateVariable as exc:
        hint = " (the task is not assigned to a node group)" if desired.group is None else ""
        raise TaskSetupError(f"{exc}{hint}") from exc
    mounts = resolve_mounts(desired, config)
    # The worker's own variables win over the spec's: the bridge client relies on them.
    env |= {
        "INTELLECT_TASK_ID": desired.task.id,
        "INTELLECT_NODE_ADDRESS": config.node_address,
        "INTELLECT_DATA_DIR": data_dir_env,
    }
    if socket_path is not None:
        env["INTELLECT_SOCKET_PATH"] = socket_path
    return PreparedTask(
        name=run_name(desired),
        task_id=desired.task.id,
        config_hash=spec.config_hash(),
        effective_hash=effective_hash(desired),
        image=spec.image,
        entrypoint=entrypoint,
        cmd=cmd,
        env=env,
        data_dir=config.data_dir(desired.task.id),
        shared_dir=config.shared_dir,
        mounts=mounts,
    )


def make_dirs(prepared: PreparedTask) -> None:
    for path in (prepared.data_dir, prepared.shared_dir, *(host for host, _ in prepared.mounts)):
        path.mkdir(parents=True, exist_ok=True)


def setup_failure(desired: AssignedTask, error: Exception) -> TaskStatus:
    return TaskStatus(
        task_id=desired.task.id,
        state=TaskState.FAILED,
        config_hash=desired.task.spec.config_hash(),
        detail=str(error)[:4096],
    )


class Runtime(ABC):
    """One task at a time per worker (a node runs its group's one task)."""

    kind: str

    def __init__(self, config: RuntimeConfig, bridge: TaskBridge | None = None) -> None:
        self.config = config
        self.bridge = bridge
        self.desired: AssignedTask | None = None  # the last desired task
        self.owns_bridge = False  # set by start_runtime(): close() then stops the bridge
        self._bridge_tasks: set[str] = set()
        self._lock = threading.RLock()

    # Failures of the machinery (engine down, disk full) that must not take the worker down: the task's
    # status says what happened and the next reconcile tries again.
    transient_errors: tuple[type[Exception], ...] = (OSError,)

    def apply(self, desired: AssignedTask | None) -> TaskStatus | None:
        """Reconcile: make the actual task match `desired` (None: run nothing) and report its status."""

        def reconcile() -> TaskStatus | None:
            self.desired = desired
            return self._apply(desired)

        return self._guard(reconcile)

    def status(self) -> TaskStatus | None:
        """The current task's status, without changing anything."""
        return self._guard(self._current_status)

    def restart(self) -> TaskStatus | None:
        """Restart the current task (also a finished one); its restart budget starts over."""
        return self._guard(self._restart)

    def _guard(self, action: Callable[..., TaskStatus | None], *args: object) -> TaskStatus | None:
        try:
            # The heartbeat loop applies while the worker API restarts: one change at a time.
            with self._lock:
                return action(*args)
        except self.transient_errors as exc:
            log.warning("%s runtime: %s", self.kind, exc)
            if self.desired is None:
                return None
            return TaskStatus(
                task_id=self.desired.task.id,
                state=TaskState.UNKNOWN,
                config_hash=self.desired.task.spec.config_hash(),
                detail=f"{self.kind} runtime unavailable: {exc}"[:4096],
            )

    @abstractmethod
    def _apply(self, desired: AssignedTask | None) -> TaskStatus | None: ...

    @abstractmethod
    def _current_status(self) -> TaskStatus | None: ...

    @abstractmethod
    def _restart(self) -> TaskStatus | None: ...

    @overload
    def logs(self, tail: int = ..., follow: Literal[False] = ...) -> list[str]: ...
    @overload
    def logs(self, tail: int = ..., follow: Literal[True] = ...) -> Iterator[str]: ...

    @abstractmethod
    def logs(self, tail: int = 100, follow: bool = False) -> list[str] | Iterator[str]:
        """The last `tail` lines of the current task's output; with follow, the lines as they come,
        until the task stops."""

    @abstractmethod
    def cleanup_stale(self) -> list[str]:
        """Stop and remove everything this runtime owns except the current task; return the names."""

    @abstractmethod
    def adopt(self) -> TaskStatus | None:
        """On worker start: take over the task a previous worker process left running."""

    def metrics(self) -> dict[str, float]:
        """The current task's latest metrics from the bridge, for the next heartbeat."""
        if self.bridge is None or self.desired is None:
            return {}
        return self.bridge.metrics(self.desired.task.id)

    def close(self) -> None:
        """Release client resources (and the bridge, when the runtime started it); running tasks keep
        running, so a new worker process adopts them."""
        if self.owns_bridge and self.bridge is not None:
            self.bridge.stop()

    def _register_with_bridge(self, task_id: str | None, container_data_dir: str | None = None) -> None:
        """Let the bridge accept messages from `task_id` only (None: from no task)."""
        if self.bridge is None:
            return
        for old in self._bridge_tasks - {task_id}:
            self.bridge.forget_task(old)
        self._bridge_tasks = set()
        if task_id is not None:
            self.bridge.allow_task(task_id, self.config.data_dir(task_id), container_data_dir)
            self._bridge_tasks = {task_id}


def tail_lines(path: Path, tail: int) -> list[str]:
    """The last `tail` lines of a text file without reading all of a large log."""
    if tail <= 0 or not path.exists():
        return []
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        end = handle.tell()
        block, data = 8192, b""
        while end > 0 and data.count(b"\n") <= tail:
            start = max(0, end - block)
            handle.seek(start)
            data = handle.read(end - start) + data
            end = start
    return data.decode(errors="replace").splitlines()[-tail:]
