"""The daemon's pid file (`<state_dir>/worker.pid`): how `deregister` finds and stops a running worker.

It records the pid and the process's start time, so a reused pid is never mistaken for the daemon.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import psutil


def pid_path(state_dir: Path) -> Path:
    return state_dir / "worker.pid"


def write_pid(state_dir: Path) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    me = psutil.Process()
    tmp = pid_path(state_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": me.pid, "started": me.create_time()}))
    os.replace(tmp, pid_path(state_dir))


def remove_pid(state_dir: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        if json.loads(pid_path(state_dir).read_text())["pid"] == os.getpid():
            pid_path(state_dir).unlink()


def running_daemon(state_dir: Path) -> int | None:
    """The pid of the worker daemon serving `state_dir`, if one runs (a stale file is ignored)."""
    try:
        record = json.loads(pid_path(state_dir).read_text())
        process = psutil.Process(int(record["pid"]))
        if abs(process.create_time() - float(record["started"])) < 0.05 and process.is_running() \
                and process.status() != psutil.STATUS_ZOMBIE:
            return process.pid
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        pass
    return None


def stop_daemon(pid: int, timeout: float) -> bool:
    """SIGTERM (the daemon says goodbye to the orchestrator first), then wait; False if it lives on."""
    try:
        process = psutil.Process(pid)
        os.kill(pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except psutil.NoSuchProcess:
        return True
    except (psutil.TimeoutExpired, PermissionError):
        return False
    return True
