"""`intellect devnet up/down` through the real CLI: anvil, contracts, funded accounts, a started pool."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import psutil

from ledger.client import LedgerClient
from ledger.models import ONE_TOKEN, PoolStatus

INTELLECT = [str(Path(sys.executable).parent / "intellect")]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*INTELLECT, *args], capture_output=True, text=True, timeout=120)


def test_devnet_up_resume_down(tmp_path: Path) -> None:
    directory = tmp_path / "devnet"
    first = run("devnet", "up", "--dir", str(directory), "--json")
    assert first.returncode == 0, first.stderr
    info = json.loads(first.stdout)
    anvil = info["processes"][0]
    try:
        assert anvil["name"] == "anvil" and anvil["alive"]
        state_file = directory / "devnet.json"
        assert stat.S_IMODE(os.stat(state_file).st_mode) == 0o600
        assert "private_key" not in first.stdout  # keys stay in the 0600 file

        client = LedgerClient(info["rpc_url"], info["deployment"])
        pool = client.get_pool(info["pool_id"])
        assert pool.status == PoolStatus.ACTIVE
        assert pool.manager == info["accounts"]["pool-manager"]
        assert client.is_validator(info["accounts"]["validator"])
        assert client.balance_of(info["accounts"]["provider-1"]) == 100_000 * ONE_TOKEN

        # Idempotent while running.
        again = run("devnet", "up", "--dir", str(directory), "--json")
        assert again.returncode == 0 and json.loads(again.stdout)["processes"][0]["pid"] == anvil["pid"]

        # Down stops anvil by pid; up resumes the same chain (same pool, same balances).
        down = run("devnet", "down", "--dir", str(directory))
        assert down.returncode == 0 and "stopped anvil" in down.stdout
        assert not psutil.pid_exists(anvil["pid"]) or psutil.Process(anvil["pid"]).status() == "zombie"
        resumed = json.loads(run("devnet", "up", "--dir", str(directory), "--json").stdout)
        assert resumed["pool_id"] == info["pool_id"]
        client = LedgerClient(resumed["rpc_url"], resumed["deployment"])
        assert client.get_pool(info["pool_id"]).status == PoolStatus.ACTIVE
        assert client.balance_of(info["accounts"]["provider-1"]) == 100_000 * ONE_TOKEN
    finally:
        run("devnet", "down", "--dir", str(directory), "--purge")
    assert not directory.exists()


def test_status_without_devnet_names_the_fix(tmp_path: Path) -> None:
    result = run("devnet", "status", "--dir", str(tmp_path / "none"))
    assert result.returncode == 1
    assert "intellect devnet up" in result.stderr
