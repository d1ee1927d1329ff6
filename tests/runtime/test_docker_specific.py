"""What only the Docker runtime does: pulls, container settings, GPU requests; and runtime selection."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from intellect.wire.tasks import TaskState
from worker.runtime import ProcessRuntime, make_runtime
from worker.runtime.bridge import TaskBridge

from .helpers import Harness


@pytest.fixture
def docker_harness(docker_ready: None, short_tmp: Path, bridge: TaskBridge):  # type: ignore[no-untyped-def]
    h = Harness("docker", short_tmp, bridge)
    yield h
    h.cleanup()


def test_a_pull_failure_is_reported_and_not_retried_in_a_tight_loop(docker_harness: Harness) -> None:
    runtime = docker_harness.runtime(pull_retry_seconds=60)
    desired = docker_harness.assign(docker_harness.spec("print:x", image="intellect-missing-image:0"))
    status = runtime.apply(desired)
    assert status.state == TaskState.FAILED
    assert "intellect-missing-image:0" in status.detail and "could not be pulled" in status.detail
    started = time.monotonic()
    assert runtime.apply(desired) == status  # inside the retry pause: the cached reason, no pull
    assert time.monotonic() - started < 0.2
    # The worker carries on: the next desired task runs.
    ok = docker_harness.assign(docker_harness.spec("print:fine"))
    deadline = time.monotonic() + 20
    while (state := runtime.apply(ok).state) not in (TaskState.COMPLETED, TaskState.FAILED):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert state == TaskState.COMPLETED


def test_container_settings(docker_harness: Harness) -> None:
    runtime = docker_harness.runtime(shm_size="64m", max_restarts=4, task_network="host")
    desired = docker_harness.assign(docker_harness.spec("sleep:30"))
    assert runtime.apply(desired).state in (TaskState.RUNNING, TaskState.PENDING)
    [container] = runtime._managed()
    host = container.attrs["HostConfig"]
    assert host["ShmSize"] == 64 * 1024 * 1024
    assert host["RestartPolicy"] == {"Name": "on-failure", "MaximumRetryCount": 4}
    assert host["Init"] is True
    assert host["NetworkMode"] == "host"  # the operator's choice (devnets: tasks reach loopback services)
    mounts = {m["Destination"]: m["Source"] for m in container.attrs["Mounts"]}
    config = docker_harness.config()
    assert mounts == {
        "/data": str(config.data_dir(desired.task.id)),
        "/shared": str(config.shared_dir),
        "/run/intellect": str(docker_harness.bridge.socket_path.parent),
    }
    labels = container.labels
    assert labels["org.intellect.node"] == docker_harness.node
    assert labels["org.intellect.config_hash"] == desired.task.spec.config_hash()
    node = docker_harness.node.lower().removeprefix("0x")[:8]  # workers sharing one engine never collide
    assert container.name == f"intellect-{desired.task.id}-{node}-{desired.task.spec.config_hash()}"


def test_gpu_requests_reach_the_engine(docker_harness: Harness) -> None:
    # This machine has no GPU: the engine refuses the device request, and that refusal is the task's
    # failed state with the engine's reason, not a crash of the worker.
    runtime = docker_harness.runtime(gpu_ids=["0"])
    desired = docker_harness.assign(docker_harness.spec("print:x"))
    status = runtime.apply(desired)
    assert status.state == TaskState.FAILED
    assert "gpu" in status.detail.lower()
    [container] = runtime._managed()
    [request] = container.attrs["HostConfig"]["DeviceRequests"]
    assert request["DeviceIDs"] == ["0"] and request["Capabilities"] == [["gpu"]]


def test_auto_picks_docker_when_an_engine_answers_else_processes(
    docker_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = make_runtime("auto", docker_harness.config(), docker_harness.bridge)
    assert runtime.kind == "docker"
    runtime.close()
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert isinstance(make_runtime("auto", docker_harness.config()), ProcessRuntime)


def test_an_unreachable_engine_is_a_status_not_a_crash(docker_harness: Harness) -> None:
    import docker

    runtime = docker_harness.runtime()
    desired = docker_harness.assign(docker_harness.spec("print:x"))
    runtime.client.close()
    # The engine goes away (a real connection failure to a socket that does not exist).
    runtime.client = docker.DockerClient(
        base_url="unix:///nonexistent/docker.sock", version="1.41", timeout=2
    )
    status = runtime.apply(desired)
    assert status.state == TaskState.UNKNOWN and "docker runtime unavailable" in status.detail
    assert runtime.status().state == TaskState.UNKNOWN
    assert runtime.restart().state == TaskState.UNKNOWN
