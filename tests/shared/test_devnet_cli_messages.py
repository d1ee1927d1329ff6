"""The devnet CLI's printed commands work as printed, and a drill of a name the devnet does not have
is refused at once, listing the names it has (not "kill -9 bogus (pid 0)" after minutes of setup)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from devnet.state import DevAccount, DevnetState, ManagedProcess

# A subprocess: under pytest `devnet` is tests/devnet (a package on the rootdir path), so an in-process
# import of devnet.cli can resolve to another checkout through the editable install.
pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


class Result:
    def __init__(self, done: subprocess.CompletedProcess[str]) -> None:
        self.exit_code, self.output = done.returncode, done.stdout + done.stderr


def intellect(args: list[str], cwd: Path) -> Result:
    env = {k: v for k, v in os.environ.items() if k != "INTELLECT_DEVNET_DIR"} | {
        "PYTHONPATH": str(REPO), "COLUMNS": "80"}
    return Result(subprocess.run([sys.executable, "-c", "from devnet.cli import app; app()", *args], cwd=cwd,
                                 env=env, capture_output=True, text=True, timeout=120))  # fmt: skip


def state_in(directory: Path) -> DevnetState:
    me = psutil.Process(os.getpid())  # a live "process" (this test), so the devnet looks running
    procs = [ManagedProcess(name=name, pid=me.pid, create_time=me.create_time(), cmd=["true"])
             for name in ("anvil", "orchestrator", "worker-1")]  # fmt: skip
    state = DevnetState(directory=str(directory), rpc_url="http://127.0.0.1:1", chain_id=31337,
                        deployment_path=str(directory / "deployment.json"), domain_id=1, pool_id=1,
                        accounts=[DevAccount(role="owner", address="0x" + "11" * 20,
                                             private_key="0x" + "22" * 32)],
                        processes=procs)  # fmt: skip
    state.save()
    return state


def test_status_of_another_dir_says_how_to_stop_that_one(tmp_path: Path) -> None:
    state_in(tmp_path / "X")
    out = intellect(["devnet", "status", "--dir", str(tmp_path / "X")], tmp_path).output
    assert f"Stop it with intellect devnet down --dir {tmp_path / 'X'}." in out
    state_in(tmp_path / ".devnet")
    out = intellect(["devnet", "status"], tmp_path).output
    assert "Stop it with intellect devnet down." in out  # the default folder needs no flag


def test_drill_refuses_an_unknown_name_listing_the_known_ones(tmp_path: Path) -> None:
    state_in(tmp_path / "X")
    result = intellect(["devnet", "drill", "bogus", "--dir", str(tmp_path / "X")], tmp_path)
    assert result.exit_code == 2, result.output
    known = "(known: anvil, orchestrator, worker-1)"
    assert f"error: no process named 'bogus' in this devnet {known}" in result.output
    assert "kill -9" not in result.output
