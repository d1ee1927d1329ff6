"""A process-runtime task outlives a dead worker by at most `orphan_ttl`, unless a restarted worker
adopts it first. The worker is a real process killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from intellect.wire.tasks import TaskState
from worker.runtime import ProcessRuntime, RuntimeConfig

from .helpers import REPO, WORKLOAD

NODE = "0x" + "ab" * 20
TTL = 2.0


def config(root: Path) -> RuntimeConfig:
    return RuntimeConfig(node_address=NODE, storage_root=root / "storage", state_dir=root / "runtime",
                         orphan_ttl=TTL, stop_timeout=2)


def start_worker(root: Path) -> tuple[subprocess.Popen[str], int]:
    """A worker process that starts a 60 s task, prints the supervisor's pid, and idles."""
    script = textwrap.dedent(f"""
        import sys, time
        from datetime import UTC, datetime
        from pathlib import Path
        from intellect.wire.tasks import AssignedTask, Task, TaskSpec
        from worker.runtime import ProcessRuntime, RuntimeConfig
        config = RuntimeConfig.model_validate_json({config(root).model_dump_json()!r})
        runtime = ProcessRuntime(config)
        spec = TaskSpec(name="t", image="none", entrypoint=[sys.executable, {str(WORKLOAD)!r}],
                        cmd=["sleep:60"])
        desired = AssignedTask(task=Task(id="orphan", spec=spec, created_at=datetime.now(UTC)))
        runtime.apply(desired)
        print("PID", runtime._load(runtime._current_name()).supervisor_pid, flush=True)
        time.sleep(600)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    worker = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    assert worker.stdout is not None
    for line in worker.stdout:  # the runtime logs on stdout too (this task names no workload: a warning)
        if line.startswith("PID "):
            return worker, int(line.split()[1])
    raise AssertionError("the worker exited before it started the task")


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def test_a_dead_workers_task_is_stopped_after_the_ttl(short_tmp: Path) -> None:
    worker, supervisor = start_worker(short_tmp)
    deadline = time.monotonic() + 10
    while len(processes := tree(supervisor)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(processes) >= 2  # the supervisor and the task
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    killed_at = time.monotonic()
    gone, alive = psutil.wait_procs(processes, timeout=TTL + 10)
    assert not alive, "the task outlived its dead worker"
    assert time.monotonic() - killed_at >= TTL - 0.5  # not before the TTL: a new worker may adopt it
    [state_file] = (short_tmp / "runtime" / "processes").glob("*/state.json")
    state = json.loads(state_file.read_text())
    assert state["state"] == "stopped" and "gone" in state["detail"]


def test_a_restarted_worker_adopts_the_task_before_the_ttl(short_tmp: Path) -> None:
    worker, supervisor = start_worker(short_tmp)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    successor = ProcessRuntime(config(short_tmp))  # this test process is the new owner
    try:
        adopted = successor.adopt()
        assert adopted is not None and adopted.task_id == "orphan"
        assert adopted.state in (TaskState.PENDING, TaskState.RUNNING)
        time.sleep(TTL + 2)
        assert psutil.pid_exists(supervisor)
        status = successor.status()
        assert status is not None and status.state == TaskState.RUNNING
    finally:
        successor.apply(None)
    assert not tree(supervisor) or not psutil.Process(supervisor).is_running()
