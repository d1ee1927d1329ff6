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
from typing import Any

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
    RuntimeBase,
    RuntimeConfig,
    make_dirs,
    prepare,
)
from worker.runtime.bridge import TaskBridge

LABEL_ASSIGNED = "org.intellect.assigned"  # the AssignedTask JSON: what adopt() restores


class DockerRuntime(RuntimeBase[Container]):
    kind = "docker"
    task_data_dir = CONTAINER_DATA
    transient_errors = (DockerException, RequestException, OSError)

    def __init__(
        self,
        config: RuntimeConfig,
        bridge: TaskBridge | None = None,
        client: docker.DockerClient | None = None,
    ) -> None:
        super().__init__(config, bridge)
        self.client = client or docker.from_env(timeout=60)
        self._pull_failures: dict[str, tuple[float, str]] = {}

    def close(self) -> None:
        super().close()
        self.client.close()

    # ---- the backend of RuntimeBase: a run is a labelled container --------------------------
    def _find(self, name: str) -> Container | None:
        return self._get(name)

    def _launch(self, prepared: PreparedTask, desired: AssignedTask, fresh: bool) -> Container | TaskStatus:
        return self._create(prepared, desired)

    def _stop_run(self, run: Container) -> None:
        # Recreate rather than restart, so the restart budget (Docker's RestartCount) starts over.
        self._remove(run)

    def _status_of(self, run: Container) -> TaskStatus:
        return self._status(run)

    def _pending_detail(self, prepared: PreparedTask) -> str:
        return self._pull_failures.get(prepared.image, (0.0, "not created yet"))[1]

    def _newest_run(self) -> tuple[AssignedTask, Container] | None:
        containers = self._managed()
        if not containers:
            return None
        newest = max(containers, key=lambda c: str(c.attrs.get("Created", "")))
        try:
            assigned = AssignedTask.model_validate_json(newest.labels.get(LABEL_ASSIGNED, ""))
        except ValueError:
            return None  # not ours to adopt after all: the first apply() removes it
        return assigned, newest

    def _tail(self, run: Container, tail: int) -> list[str]:
        return run.logs(tail=tail, stdout=True, stderr=True).decode(errors="replace").splitlines()

    def _follow(self, run: Container, tail: int) -> Iterator[str]:
        pending = b""
        for chunk in run.logs(stream=True, follow=True, tail=tail):
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
                network_mode=self.config.task_network,
                detach=True,
                # docker-init as PID 1: signals reach the task and zombies are reaped.
                init=True,
                stop_signal="SIGTERM",
                # Docker reads MaximumRetryCount 0 as "no limit": no restarts is policy "no".
                restart_policy=(
                    {"Name": "on-failure", "MaximumRetryCount": self.config.max_restarts}
                    if self.config.max_restarts > 0
                    else {"Name": "no"}
                ),
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
    def _just_finished(state: dict[str, Any]) -> bool:
        finished = state.get("FinishedAt", "")
        try:
            # Docker reports nanoseconds; Python parses up to microseconds.
            stamp = datetime.fromisoformat(finished[:26].rstrip("Z") + "+00:00")
        except ValueError:
            return False
        return (datetime.now(stamp.tzinfo) - stamp).total_seconds() < 1.0
