"""Task runtimes: Docker (a real engine) and process (no engine: CI, pods, laptops).

`start_runtime(...)` is what the worker daemon calls: it starts the task bridge in the state dir (with
the worker's file record, `worker.files`, an older worker's uploader journal merged into it), builds
the runtime ("auto": Docker when an engine answers, else processes) and hands it the bridge.
Everything the worker needs of a runtime is the `Runtime` protocol; both real runtimes implement it
over the `RuntimeBase` skeleton, and `RecordingRuntime` (no execution) implements it on its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from worker.files import LEGACY_JOURNAL
from worker.hardware import docker_reachable
from worker.runtime.base import Runtime, RuntimeBase, RuntimeConfig, TaskSetupError, run_name
from worker.runtime.bridge import TaskBridge, socket_path_for
from worker.runtime.docker import DockerRuntime
from worker.runtime.process import ProcessRuntime
from worker.runtime.recording import RecordingRuntime

RuntimeKind = Literal["auto", "docker", "process"]

__all__ = [
    "DockerRuntime",
    "ProcessRuntime",
    "RecordingRuntime",
    "Runtime",
    "RuntimeBase",
    "RuntimeConfig",
    "RuntimeKind",
    "TaskSetupError",
    "make_runtime",
    "run_name",
    "start_runtime",
]


def make_runtime(kind: str, config: RuntimeConfig, bridge: TaskBridge | None = None) -> RuntimeBase[Any]:
    """`kind`: auto (Docker when an engine answers, else processes), docker or process."""
    if kind == "process":
        return ProcessRuntime(config, bridge)
    if kind not in ("auto", "docker"):
        raise ValueError(f"unknown runtime {kind!r}: use auto, docker or process")
    if kind == "docker" or docker_reachable(timeout=3.0):
        return DockerRuntime(config, bridge)
    return ProcessRuntime(config, bridge)


def start_runtime(
    kind: str,
    node_address: str,
    state_dir: Path,
    storage_root: Path | None = None,
    adopt: bool = True,
    signer: Callable[[str], str] | None = None,
    **options: Any,
) -> RuntimeBase[Any]:
    """Bridge + runtime for a worker whose state lives in `state_dir`; `options` are RuntimeConfig
    fields (max_restarts, shm_size, gpu_ids, p2p_seed, ...). With `adopt`, a task left running by a
    previous worker process is taken over (see `runtime.desired` / `runtime.status()`).
    `runtime.close()` stops the bridge; the task keeps running. `signer`: the node key's
    `sign_message`, with which the bridge signs a group member's link commitments (`sign_link`)."""
    confines = os.geteuid() == 0 and options.get("task_isolation", "auto") != "off"
    task_gid = options.get("task_gid", RuntimeConfig.model_fields["task_gid"].default) if confines else None
    bridge = TaskBridge(socket_path_for(state_dir), state_dir / "bridge", task_gid, signer)
    bridge.files.merge_journal(state_dir / LEGACY_JOURNAL)  # before the uploader's first pass
    bridge.start()
    config = RuntimeConfig(
        node_address=node_address,
        storage_root=storage_root or state_dir / "storage",
        state_dir=state_dir / "runtime",
        socket_path=bridge.socket_path,
        **options,
    )
    try:
        runtime = make_runtime(kind, config, bridge)
    except Exception:
        bridge.stop()
        raise
    runtime.owns_bridge = True
    if adopt:
        runtime.adopt()
    return runtime
