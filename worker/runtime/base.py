"""The runtime interface and what both runtimes share: config, naming, templating, directories.

A runtime turns the desired task (from the heartbeat reply) into running work and reports its
state. `apply` is a reconcile step: called every loop with the same input it does nothing new.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Generic, Literal, Protocol, TypeVar, overload, runtime_checkable

import structlog
from pydantic import BaseModel, ConfigDict, Field

from intellect.wire.heartbeat import TaskStatus
from intellect.wire.tasks import AssignedTask, TaskState
from intellect.wire.templates import UnknownTemplateVariable, expand
from intellect.workloads import UNJUDGED
from worker.runtime.bridge import TaskBridge

log = structlog.get_logger(__name__)
H = TypeVar("H")  # a backend's handle on one run

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
    p2p_port: int | None = Field(default=None, ge=1, le=65535, description="value of ${WORKER_P2P_PORT}")
    max_restarts: int = Field(default=3, ge=0, description="restarts after a failure before 'failed'")
    restart_delay: float = Field(default=1.0, ge=0, description="first restart back-off (process runtime)")
    shm_size: str = Field(default="1g", description="/dev/shm size of a container")
    gpu_ids: list[str] = Field(default_factory=list, description="detected GPUs handed to the task")
    stop_timeout: float = Field(default=10.0, ge=0, description="SIGTERM → SIGKILL grace period")
    pull_retry_seconds: float = Field(default=30.0, ge=0, description="wait before re-trying a failed pull")
    task_env: dict[str, str] = Field(default_factory=dict, description="operator's extra task env")
    task_network: str | None = Field(default=None, description="Docker network of task containers "
                                     "(None: the engine's default bridge; 'host' to reach loopback services)")
    task_isolation: Literal["auto", "require", "off"] = Field(
        default="auto", description="process runtime: confine tasks (own namespaces, own root, the task "
        "user) when the worker is root; 'require' fails a task that cannot be, 'off' never confines")
    task_software: list[Path] = Field(default_factory=list, description="process runtime: folders a "
                                      "confined task may read besides the worker's own environment")
    task_uid: int = Field(default=65534, ge=1, description="user a confined task runs as (nobody)")
    task_gid: int = Field(default=65534, ge=1, description="group a confined task runs as (nogroup)")
    orphan_ttl: float = Field(default=15.0, gt=0, description="a task outlives a dead worker by at most "
                              "this (process runtime; the orchestrator's heartbeat TTL by default)")

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


def run_name(desired: AssignedTask, node_address: str = "") -> str:
    """Unique per task, placement and node: several workers may share one Docker engine."""
    node = node_address.lower().removeprefix("0x")[:8]
    return f"intellect-{safe_name(desired.task.id, 48)}-{node + '-' if node else ''}{effective_hash(desired)}"


_NO_GROUP = "the task is not assigned to a node group"
WHY_NO_VALUE = {  # why a known variable can lack a value, for the task's failure detail (docs/runtime.md)
    "GROUP_ID": _NO_GROUP, "GROUP_INDEX": _NO_GROUP, "GROUP_SIZE": _NO_GROUP,
    "NEXT_P2P_ADDRESS": "the task's node group has no next peer address",
    "P2P_INBOX": _NO_GROUP,
    "P2P_OUTBOX": "the task's node group has no next peer address",
    "GROUP_SECRET": "the task is not in a node group, or its group has no secret (an orchestrator too "
                    "old to derive one?)",
    "MEMBER_SECRET": "the task is not in a node group, or its orchestrator derives no member keys",
    "GROUP_KEYS": "the task is not in a node group, or its orchestrator derives no member keys",
    "GROUP_MEMBERS": "the task is not in a node group, or its orchestrator names no members",
    "WORKER_P2P_SEED": "this worker has no p2p seed configured (INTELLECT_WORKER_P2P_SEED)",
    "WORKER_P2P_PORT": "this worker has no p2p port configured (INTELLECT_WORKER_P2P_PORT)",
    "SOCKET_PATH": "this worker runs no task bridge",
}  # fmt: skip


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
        # How this member's links open (docs/storage-and-groups.md, "Members behind NAT"): "listen",
        # or the address to dial. A member behind NAT dials its predecessor's listening outbox; the
        # member before one behind NAT listens with its outbox (at WORKER_P2P_PORT + 1).
        values["P2P_INBOX"] = desired.group.prev_p2p_address or "listen"
        if desired.group.next_dials_in:
            values["P2P_OUTBOX"] = "listen"
        elif desired.group.next_p2p_address is not None:
            values["P2P_OUTBOX"] = desired.group.next_p2p_address
        if desired.group.secret is not None:
            values["GROUP_SECRET"] = desired.group.secret
        if desired.group.member_secret is not None and desired.group.group_keys is not None:
            values["MEMBER_SECRET"] = desired.group.member_secret
            values["GROUP_KEYS"] = ",".join(desired.group.group_keys)
        if desired.group.members is not None:
            values["GROUP_MEMBERS"] = ",".join(desired.group.members)
    if config.p2p_seed is not None:
        values["WORKER_P2P_SEED"] = config.p2p_seed
    if config.p2p_port is not None:
        values["WORKER_P2P_PORT"] = str(config.p2p_port)
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
        why = WHY_NO_VALUE.get(exc.name or "", "this worker does not know it")
        raise TaskSetupError(f"{exc}: {why}") from exc
    mounts = resolve_mounts(desired, config)
    # The operator's extra environment overrides the spec's (a contributor's machine, their choice);
    # the worker's own variables win over both: the bridge client relies on them.
    env |= config.task_env
    env |= {
        "INTELLECT_TASK_ID": desired.task.id,
        "INTELLECT_NODE_ADDRESS": config.node_address,
        "INTELLECT_DATA_DIR": data_dir_env,
    }
    if socket_path is not None:
        env["INTELLECT_SOCKET_PATH"] = socket_path
    return PreparedTask(
        name=run_name(desired, config.node_address),
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


@runtime_checkable
class Runtime(Protocol):
    """What the worker (heartbeat loop, API, daemon) needs of a task runtime.

    `apply` is both start and stop: it reconciles the running task to the desired one (None: stop
    everything). The Docker and process runtimes implement it over `RuntimeBase`; the recording
    runtime (`worker.runtime.recording`) only remembers what it was asked to run."""

    bridge: TaskBridge | None

    def apply(self, desired: AssignedTask | None) -> TaskStatus | None: ...
    def status(self) -> TaskStatus | None: ...
    def restart(self) -> TaskStatus | None: ...
    def logs(self, tail: int = 100) -> list[str]: ...
    def adopt(self) -> TaskStatus | None: ...
    def metrics(self) -> dict[str, float]: ...
    def close(self) -> None: ...


class RuntimeBase(ABC, Generic[H]):
    """The reconcile skeleton both real runtimes share; a backend supplies how to find, launch, stop,
    read and list its runs (`H`: a container, or a process run record). One task at a time per worker
    (a node runs its group's one task)."""

    kind: str
    # Where the task sees its data dir, if not at the host path (the bridge maps file paths with it).
    task_data_dir: str | None = None

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

    # ---- the public interface (Runtime) --------------------------------------------------------

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

    @overload
    def logs(self, tail: int = ..., follow: Literal[False] = ...) -> list[str]: ...
    @overload
    def logs(self, tail: int = ..., *, follow: Literal[True]) -> Iterator[str]: ...

    def logs(self, tail: int = 100, follow: bool = False) -> list[str] | Iterator[str]:
        """The last `tail` lines of the current task's output; with follow, the lines as they come,
        until the task stops."""
        run = self._current_run()
        if follow:
            return self._follow(run, tail) if run is not None else iter(())
        if run is None or tail <= 0:
            return []
        return self._tail(run, tail)

    def stop_all(self) -> list[str]:
        """Stop and remove every run this node owns, finished or not (the node left for good: nothing
        will ever adopt them); the names removed."""

        def remove() -> list[str]:
            self.desired = None
            return self._remove_except(None)

        with self._lock:
            return remove()

    def adopt(self) -> TaskStatus | None:
        """On worker start: take over the task a previous worker process left running (the newest of
        the runs this node owns; the first apply() removes the others).

        A run found failed is started again (its data kept, its restart budget new): it may have
        failed because no worker was there (its bridge gone, or stopped as an orphan), and a worker
        that reports Healthy with a task assigned must be running it, not showing an old failure."""
        with self._lock:
            newest = self._newest_run()
            if newest is None:
                return None
            assigned, run = newest
            self.desired = assigned
            self._register_with_bridge(assigned.task.id, self.task_data_dir)
            status = self._status_of(run)
            if status.state != TaskState.FAILED:
                return status
            log.info("adopted a failed task: running it again", task_id=assigned.task.id,
                     was=status.detail)
            return self._restart()

    def cleanup_stale(self) -> list[str]:
        """Stop and remove everything this runtime owns except the current task; return the names."""
        return self._remove_except(self._current_name())

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

    # ---- the shared skeleton -------------------------------------------------------------------

    def _guard(self, action: Callable[[], TaskStatus | None]) -> TaskStatus | None:
        try:
            # The heartbeat loop applies while the worker API restarts: one change at a time.
            with self._lock:
                return action()
        except self.transient_errors as exc:
            log.warning("runtime status failed", runtime=self.kind, error=str(exc))
            if self.desired is None:
                return None
            return TaskStatus(
                task_id=self.desired.task.id,
                state=TaskState.UNKNOWN,
                config_hash=self.desired.task.spec.config_hash(),
                detail=f"{self.kind} runtime unavailable: {exc}"[:4096],
            )

    def _apply(self, desired: AssignedTask | None) -> TaskStatus | None:
        if desired is None:
            self._register_with_bridge(None)
            self._remove_except(None)
            return None
        try:
            prepared = self._prepare(desired)
        except TaskSetupError as exc:
            self._register_with_bridge(None)
            self._remove_except(None)
            return setup_failure(desired, exc)
        self._remove_except(prepared.name)
        # Before the start: a task may talk to the bridge in its first millisecond.
        self._register_with_bridge(desired.task.id, self.task_data_dir)
        run = self._find(prepared.name)
        if run is None:
            if desired.task.spec.workload is None:  # the contributor should know before spending compute
                log.warning("starting a task that names no workload", task_id=desired.task.id,
                            judged=UNJUDGED)  # fmt: skip
            launched = self._launch(prepared, desired, fresh=True)
            if isinstance(launched, TaskStatus):
                return launched
            run = launched
        return self._status_of(run)

    def _prepared_desired(self) -> tuple[AssignedTask, PreparedTask] | TaskStatus | None:
        """The desired task and its prepared form; its setup failure as a status; None: no task."""
        if self.desired is None:
            return None
        try:
            return self.desired, self._prepare(self.desired)
        except TaskSetupError as exc:
            return setup_failure(self.desired, exc)

    def _current_status(self) -> TaskStatus | None:
        found = self._prepared_desired()
        if not isinstance(found, tuple):
            return found
        _, prepared = found
        run = self._find(prepared.name)
        if run is None:
            return TaskStatus(task_id=prepared.task_id, state=TaskState.PENDING,
                              config_hash=prepared.config_hash, detail=self._pending_detail(prepared))
        return self._status_of(run)

    def _restart(self) -> TaskStatus | None:
        found = self._prepared_desired()
        if not isinstance(found, tuple):
            return found
        desired, prepared = found
        old = self._find(prepared.name)
        if old is not None:
            self._stop_run(old)
        launched = self._launch(prepared, desired, fresh=False)
        return launched if isinstance(launched, TaskStatus) else self._status_of(launched)

    def _current_name(self) -> str | None:
        if self.desired is None:
            return None
        try:
            return self._prepare(self.desired).name
        except TaskSetupError:
            return None

    def _current_run(self) -> H | None:
        name = self._current_name()
        return self._find(name) if name is not None else None

    def _pending_detail(self, prepared: PreparedTask) -> str:
        return "not started yet"

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

    # ---- what a backend supplies ---------------------------------------------------------------

    @abstractmethod
    def _prepare(self, desired: AssignedTask) -> PreparedTask:
        """Templates expanded and paths resolved the way this backend runs them (TaskSetupError)."""

    @abstractmethod
    def _find(self, name: str) -> H | None:
        """The run called `name`, if this runtime has one (running or finished)."""

    @abstractmethod
    def _launch(self, prepared: PreparedTask, desired: AssignedTask, fresh: bool) -> H | TaskStatus:
        """Start the task; a TaskStatus (failed) when it cannot be started. `fresh`: not a restart."""

    @abstractmethod
    def _stop_run(self, run: H) -> None:
        """Stop the run (for a restart of the same task)."""

    @abstractmethod
    def _remove_except(self, keep: str | None) -> list[str]:
        """Stop and remove every owned run but `keep`; return the names removed."""

    @abstractmethod
    def _status_of(self, run: H) -> TaskStatus: ...

    @abstractmethod
    def _newest_run(self) -> tuple[AssignedTask, H] | None:
        """The newest owned run and the assignment it was started for (what adopt() takes over)."""

    @abstractmethod
    def _tail(self, run: H, tail: int) -> list[str]: ...

    @abstractmethod
    def _follow(self, run: H, tail: int) -> Iterator[str]: ...


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
