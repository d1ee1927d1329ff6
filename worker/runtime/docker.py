"""Docker runtime: the task spec run as a container through the Docker SDK (a real engine).

Containers are named `intellect-<task>-<effective hash>` (spec hash, plus the node-group placement)
and labelled with the node, task and hashes, so a changed spec or placement replaces the container,
a restarted worker finds (adopts) its container by label, and nothing else on the host is touched.
Restarts after a failure are Docker's own `on-failure` policy with a cap.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.containers import Container
from docker.types import DeviceRequest, Mount
from requests import RequestException

from intellect.wire.heartbeat import TaskStatus
from intellect.wire.tasks import AssignedTask, TaskState
from worker.runtime.base import (
    CONTAINER_DATA,
    CONTAINER_SHARED,
    CONTAINER_SOCKET_DIR,
    LABEL_CONFIG,
    LABEL_EFFECTIVE,
    LABEL_MANAGED,
    LABEL_NODE,
    LABEL_TASK,
    PreparedTask,
    Runtime,
    RuntimeConfig,
    TaskSetupError,
    make_dirs,
    prepare,
    setup_failure,
)

LABEL_ASSIGNED = "org.intellect.assigned"  # the AssignedTask JSON: what adopt() restores


def engine_available(timeout: float = 3.0) -> bool:
    """A Docker engine answers at DOCKER_HOST (or the default socket)."""
    try:
        client = docker.from_env(timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except DockerException:
        return False


class DockerRuntime(Runtime):
    kind = "docker"
    transient_errors = (DockerException, RequestException, OSError)

    def __init__(self, config: RuntimeConfig, bridge=None, client: docker.DockerClient | None = None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(config, bridge)
        self.client = client or docker.from_env(timeout=60)
        self._pull_failures: dict[str, tuple[float, str]] = {}

    # ---- reconcile -------------------------------------------------------------------------
    def _apply(self, desired: AssignedTask | None) -> TaskStatus | None:
        if desired is None:
            self._register_with_bridge(None)
            self.cleanup_stale()
            return None
        try:
            prepared = self._prepare(desired)
        except TaskSetupError as exc:
            self._register_with_bridge(None)
            self._remove_except(None)
            return setup_failure(desired, exc)
        self._remove_except(prepared.name)
        # Before the start: a task may talk to the bridge in its first millisecond.
        self._register_with_bridge(desired.task.id, CONTAINER_DATA)
        container = self._get(prepared.name)
        if container is None:
            created = self._create(prepared, desired)
            if isinstance(created, TaskStatus):
                return created
            container = created
        return self._status(container)

    def _current_status(self) -> TaskStatus | None:
        if self.desired is None:
            return None
        try:
            prepared = self._prepare(self.desired)
        except TaskSetupError as exc:
            return setup_failure(self.desired, exc)
        container = self._get(prepared.name)
        if container is None:
            detail = self._pull_failures.get(prepared.image, (0.0, "not created yet"))[1]
            return TaskStatus(
                task_id=prepared.task_id,
                state=TaskState.PENDING,
                config_hash=prepared.config_hash,
                detail=detail,
            )
        return self._status(container)

    def _restart(self) -> TaskStatus | None:
        """Recreate the container, so the restart budget (Docker's RestartCount) starts over."""
        if self.desired is None:
            return None
        try:
            prepared = self._prepare(self.desired)
        except TaskSetupError as exc:
            return setup_failure(self.desired, exc)
        old = self._get(prepared.name)
        if old is not None:
            self._remove(old)
        created = self._create(prepared, self.desired)
        return created if isinstance(created, TaskStatus) else self._status(created)

    def cleanup_stale(self) -> list[str]:
        keep = None
        if self.desired is not None:
            try:
                keep = self._prepare(self.desired).name
            except TaskSetupError:
                keep = None
        return self._remove_except(keep)

    def adopt(self) -> TaskStatus | None:
        containers = self._managed()
        if not containers:
            return None
        newest = max(containers, key=lambda c: c.attrs.get("Created", ""))
        try:
            self.desired = AssignedTask.model_validate_json(newest.labels.get(LABEL_ASSIGNED, ""))
        except ValueError:
            return None  # not ours to adopt after all: the first apply() removes it
        self._register_with_bridge(self.desired.task.id, CONTAINER_DATA)
        return self._status(newest)

    def close(self) -> None:
        super().close()
        self.client.close()

    # ---- logs ------------------------------------------------------------------------------
    def logs(self, tail: int = 100, follow: bool = False) -> list[str] | Iterator[str]:  # type: ignore[override]
        container = self._current()
        if not follow:
            if container is None or tail <= 0:
                return []
            return container.logs(tail=tail, stdout=True, stderr=True).decode(errors="replace").splitlines()
        return self._follow(container, tail)

    def _follow(self, container: Container | None, tail: int) -> Iterator[str]:
        if container is None:
            return
        pending = b""
        for chunk in container.logs(stream=True, follow=True, tail=tail):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            yield from (line.decode(errors="replace") for line in lines)
        if pending:
            yield pending.decode(errors="replace")

    # ---- internals -------------------------------------------------------------------------
    def _prepare(self, desired: AssignedTask) -> PreparedTask:
        socket = f"{CONTAINER_SOCKET_DIR}/{self.config.socket_path.name}" if self.config.socket_path else None
        return prepare(desired, self.config, socket, CONTAINER_DATA)

    def _managed(self) -> list[Container]:
        filters = {"label": [f"{LABEL_MANAGED}=true", f"{LABEL_NODE}={self.config.node_address}"]}
        return self.client.containers.list(all=True, filters=filters)

    def _get(self, name: str) -> Container | None:
        try:
            return self.client.containers.get(name)
        except NotFound:
            return None

    def _current(self) -> Container | None:
        if self.desired is None:
            return None
        try:
            return self._get(self._prepare(self.desired).name)
        except TaskSetupError:
            return None

    def _remove(self, container: Container) -> None:
        try:
            if container.status in ("running", "restarting", "paused"):
                container.stop(timeout=int(self.config.stop_timeout))
            container.remove(force=True)
        except NotFound:
            pass

    def _remove_except(self, keep: str | None) -> list[str]:
        removed = []
        for container in self._managed():
            if container.name != keep:
                self._remove(container)
                removed.append(container.name)
        return removed

    def _ensure_image(self, image: str) -> str | None:
        """None when the image is ready; else why not. Pull failures are retried after a pause."""
        try:
            self.client.images.get(image)
            return None
        except ImageNotFound:
            pass
        failed_at, reason = self._pull_failures.get(image, (0.0, ""))
        if reason and time.monotonic() - failed_at < self.config.pull_retry_seconds:
            return reason
        try:
            self.client.images.pull(image)
        except (APIError, DockerException) as exc:
            reason = f"image {image!r} is not present and could not be pulled: {exc}"[:2000]
            self._pull_failures[image] = (time.monotonic(), reason)
            return reason
        self._pull_failures.pop(image, None)
        return None

    def _create(self, prepared: PreparedTask, desired: AssignedTask) -> Container | TaskStatus:
        failure = self._ensure_image(prepared.image)
        if failure is not None:
            return TaskStatus(
                task_id=prepared.task_id,
                state=TaskState.FAILED,
                config_hash=prepared.config_hash,
                detail=failure,
            )
        make_dirs(prepared)
        mounts = [
            Mount(CONTAINER_DATA, str(prepared.data_dir), type="bind"),
            Mount(CONTAINER_SHARED, str(prepared.shared_dir), type="bind"),
        ]
        mounts += [Mount(target, str(host), type="bind") for host, target in prepared.mounts]
        if self.config.socket_path is not None:
            mounts.append(Mount(CONTAINER_SOCKET_DIR, str(self.config.socket_path.parent), type="bind"))
        devices = (
            [DeviceRequest(device_ids=self.config.gpu_ids, capabilities=[["gpu"]])]
            if self.config.gpu_ids
            else []
        )
        labels = {
            LABEL_MANAGED: "true",
            LABEL_NODE: self.config.node_address,
            LABEL_TASK: prepared.task_id,
            LABEL_CONFIG: prepared.config_hash,
            LABEL_EFFECTIVE: prepared.effective_hash,
            LABEL_ASSIGNED: desired.model_dump_json(),
        }
        try:
            container = self.client.containers.create(
                prepared.image,
                name=prepared.name,
                command=prepared.cmd or None,
                entrypoint=prepared.entrypoint,
                environment=prepared.env,
                labels=labels,
                mounts=mounts,
                device_requests=devices,
                shm_size=self.config.shm_size,
                detach=True,
                # docker-init as PID 1: signals reach the task and zombies are reaped.
                init=True,
                stop_signal="SIGTERM",
                restart_policy={"Name": "on-failure", "MaximumRetryCount": self.config.max_restarts},
            )
        except (APIError, DockerException) as exc:
            return TaskStatus(
                task_id=prepared.task_id,
                state=TaskState.FAILED,
                config_hash=prepared.config_hash,
                detail=f"cannot create the container: {exc}"[:4096],
            )
        try:
            container.start()
        except APIError as exc:
            # e.g. the command does not exist in the image: the container stays, in state "created".
            container.reload()
            return self._status(container, start_error=str(exc))
        container.reload()
        return container

    def _status(self, container: Container, start_error: str | None = None) -> TaskStatus:
        try:
            container.reload()
        except NotFound:
            return TaskStatus(
                task_id=container.labels.get(LABEL_TASK, "?"),
                state=TaskState.UNKNOWN,
                detail="the container disappeared",
            )
        state = container.attrs.get("State", {})
        labels = container.labels
        restarts = int(container.attrs.get("RestartCount", 0))
        base = {"task_id": labels.get(LABEL_TASK, "?"), "config_hash": labels.get(LABEL_CONFIG)}
        status, code = state.get("Status"), state.get("ExitCode")
        error = start_error or state.get("Error") or None
        if status == "running":
            detail = f"running after {restarts} restart(s)" if restarts else None
            return TaskStatus(**base, state=TaskState.RUNNING, detail=detail)
        if status == "restarting":
            return TaskStatus(
                **base,
                state=TaskState.RESTARTING,
                exit_code=code,
                detail=f"exited with code {code}; restart {restarts + 1}/{self.config.max_restarts}",
            )
        if status == "created":
            if error:
                return TaskStatus(**base, state=TaskState.FAILED, exit_code=code, detail=error[:4096])
            return TaskStatus(**base, state=TaskState.PENDING, detail="created")
        if status == "exited":
            if code == 0:
                return TaskStatus(**base, state=TaskState.COMPLETED, exit_code=0)
            if error:
                return TaskStatus(**base, state=TaskState.FAILED, exit_code=code, detail=error[:4096])
            if restarts < self.config.max_restarts and self._just_finished(state):
                # Between the exit and Docker's restart decision: not failed yet.
                return TaskStatus(
                    **base,
                    state=TaskState.RESTARTING,
                    exit_code=code,
                    detail=f"exited with code {code}; restarting",
                )
            return TaskStatus(
                **base,
                state=TaskState.FAILED,
                exit_code=code,
                detail=f"exited with code {code} after {restarts} restart(s)",
            )
        if status in ("dead", "removing"):
            return TaskStatus(**base, state=TaskState.FAILED, exit_code=code, detail=f"container is {status}")
        return TaskStatus(**base, state=TaskState.UNKNOWN, detail=f"container status {status!r}")

    @staticmethod
    def _just_finished(state: dict) -> bool:  # type: ignore[type-arg]
        finished = state.get("FinishedAt", "")
        try:
            # Docker reports nanoseconds; Python parses up to microseconds.
            stamp = datetime.fromisoformat(finished[:26].rstrip("Z") + "+00:00")
        except ValueError:
            return False
        return (datetime.now(stamp.tzinfo) - stamp).total_seconds() < 1.0
