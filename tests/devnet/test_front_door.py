"""The main command works every time (issue 24): an `up` that fails stops what it started. (A second
`devnet up --demo` after `down` is a new run as good as the first: tests/devnet/test_demo.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil

from devnet.network import strays
from devnet.state import DevnetState

INTELLECT = str(Path(sys.executable).parent / "intellect")


def intellect(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([INTELLECT, *args], capture_output=True, text=True, timeout=timeout)


def test_a_failed_up_stops_what_it_started(tmp_path: Path) -> None:
    directory = tmp_path / "devnet"
    directory.mkdir()
    (directory / "worker-1").write_text("a file where worker-1's state folder goes: the worker cannot start")
    failed = intellect("devnet", "up", "--dir", str(directory), "--workers", "1")
    try:
        assert failed.returncode == 1
        assert "devnet up failed" in failed.stderr and "worker-1" in failed.stderr, failed.stderr
        assert "stopped what it had started" in failed.stderr, failed.stderr
        state = DevnetState.load(directory)
        assert state is not None and not any(p.alive() for p in state.processes)
        assert strays(directory) == []
        # redis-server hides its environment under its title: known by its data folder here
        assert not [p for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith("redis")
                    and str(directory) in _cwd(p)]
    finally:
        intellect("devnet", "down", "--dir", str(directory))


def _cwd(proc: psutil.Process) -> str:
    try:
        return proc.cwd()
    except psutil.Error:
        return ""


# `test_the_demo_runs_again_after_down` (a second demo after `down` is a new run) is now the second half of
# tests/devnet/test_demo.py::test_demo_trains_slashes_the_cheater_and_cleans_up: its first run is that demo.
