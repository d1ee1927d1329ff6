"""Faults on real processes: kill -9 each devnet service with work in flight, restart it with
`intellect devnet restart`, and check that nothing was lost; then `down` + `up` of the whole devnet.

The drill (devnet/drill.py) posts a task that every worker runs; each worker's file is uploaded and
recorded on chain. After each fault the test asks, through the real CLI, that every task, every
Healthy node with a heartbeat sent after the kill, every node's assignment, every on-chain work record
and each worker's single task supervisor are back, and prints the recovery seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from devnet.drill import Drill
from devnet.state import DevnetState

INTELLECT = [str(Path(sys.executable).parent / "intellect")]
SERVICES = ["redis", "orchestrator", "discovery", "worker-1", "anvil"]


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*INTELLECT, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def devnet_dir(tmp_path: Path):
    directory = tmp_path / "devnet"
    up = run("devnet", "up", "--dir", str(directory), "--workers", "2", "--json")
    assert up.returncode == 0, up.stderr
    yield directory
    run("devnet", "down", "--dir", str(directory), "--purge")


def test_kill_9_each_service_then_down_and_up_loses_nothing(devnet_dir: Path) -> None:
    result = run("devnet", "drill", *SERVICES, "--dir", str(devnet_dir), "--json", "--timeout", "120")
    assert result.returncode == 0, result.stdout + result.stderr
    faults = json.loads(result.stdout)
    print("\nfault drill:", json.dumps(faults, indent=1))
    assert [f["service"] for f in faults] == SERVICES
    for fault in faults:
        assert fault["lost"] == [] and fault["recovered_seconds"] is not None, fault
        assert fault["new_pid"] != fault["killed_pid"]
        assert not psutil.pid_exists(fault["killed_pid"]) or \
            psutil.Process(fault["killed_pid"]).status() == psutil.STATUS_ZOMBIE

    # The drill's state survives a second drill's baseline: the same task, no new submissions.
    state = DevnetState.load(devnet_dir)
    assert state is not None
    drill = Drill(state, progress=lambda _msg: None)
    try:
        before = drill.snapshot()
        assert before is not None and len(before.tasks) == 1 and before.work_records == 2

        # The whole devnet down and up again: the task, the nodes, the chain records come back.
        down = run("devnet", "down", "--dir", str(devnet_dir))
        assert down.returncode == 0 and "stopped anvil" in down.stdout
        assert all(count == 0 for _, count in drill.supervisors().items())  # down leaves no task behind
        restarted_at = time.time()
        up = run("devnet", "up", "--dir", str(devnet_dir), "--workers", "2", "--json")
        assert up.returncode == 0, up.stderr
    finally:
        drill.close()
    state = DevnetState.load(devnet_dir)
    assert state is not None
    drill = Drill(state, progress=lambda _msg: None)
    try:
        deadline, gaps = time.monotonic() + 120, ["not checked"]
        while time.monotonic() < deadline:
            gaps = before.missing_from(drill.snapshot(), since=restarted_at)
            if not gaps:
                break
            time.sleep(1)
        assert gaps == [], gaps
        print(f"down + up: everything back {time.time() - restarted_at:.1f}s after `up` started")
    finally:
        drill.close()


def test_restart_names_what_it_does_not_know(tmp_path: Path) -> None:
    missing = run("devnet", "restart", "orchestrator", "--dir", str(tmp_path / "none"))
    assert missing.returncode == 1 and "intellect devnet up" in missing.stderr
