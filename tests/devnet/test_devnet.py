"""`intellect devnet up/down` through the real CLI: anvil, contracts, funded accounts, a started pool."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from ledger.client import LedgerClient
from ledger.models import ONE_TOKEN, PoolStatus

INTELLECT = [str(Path(sys.executable).parent / "intellect")]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*INTELLECT, *args], capture_output=True, text=True, timeout=120)


def test_devnet_up_resume_down(tmp_path: Path) -> None:
    directory = tmp_path / "devnet"
    first = run("devnet", "up", "--dir", str(directory), "--json", "--workers", "2")
    assert first.returncode == 0, first.stderr
    info = json.loads(first.stdout)
    anvil = info["processes"][0]
    try:
        assert anvil["name"] == "anvil" and anvil["alive"]
        names = [p["name"] for p in info["processes"]]
        assert names == ["anvil", "redis", "discovery", "orchestrator", "worker-1", "worker-2"]
        assert all(p["alive"] for p in info["processes"])
        orchestrator = next(p["url"] for p in info["processes"] if p["name"] == "orchestrator")
        token = Path(info["orchestrator_admin_token_file"]).read_text().strip()
        nodes = [info["accounts"]["node-1"], info["accounts"]["node-2"]]

        def healthy() -> set[str]:
            reply = httpx.get(
                f"{orchestrator}/nodes", headers={"Authorization": f"Bearer {token}"}, timeout=5
            )
            return {n["address"] for n in reply.json()["nodes"] if n["state"] == "Healthy"}

        deadline = time.monotonic() + 90
        while healthy() != set(nodes) and time.monotonic() < deadline:
            time.sleep(1)
        assert healthy() == set(nodes)
        state_file = directory / "devnet.json"
        assert stat.S_IMODE(os.stat(state_file).st_mode) == 0o600
        assert "private_key" not in first.stdout  # keys stay in the 0600 file
        # No service holds a key in its environment (a task reading /proc/<pid>/environ finds paths
        # to 0600 files at most): issue 19.2.
        accounts = json.loads(state_file.read_text())["accounts"]
        keys = {a["private_key"].lower().removeprefix("0x") for a in accounts}
        for proc in info["processes"]:
            environ = Path(f"/proc/{proc['pid']}/environ").read_bytes().decode(errors="replace").lower()
            assert not any(k in environ for k in keys), f"{proc['name']} holds a key in its environment"
        key_files = list((directory / "keys").glob("*.key"))
        assert key_files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in key_files)

        client = LedgerClient(info["rpc_url"], info["deployment"])
        assert set(client.pool_nodes(info["pool_id"])) == set(nodes)
        pool = client.get_pool(info["pool_id"])
        assert pool.status == PoolStatus.ACTIVE
        assert pool.manager == info["accounts"]["pool-manager"]
        assert client.is_validator(info["accounts"]["validator"])
        provider = info["accounts"]["provider-1"]
        balance = client.balance_of(provider)
        assert balance + client.get_provider(provider).stake == 100_000 * ONE_TOKEN

        # Idempotent while running.
        again = run("devnet", "up", "--dir", str(directory), "--json")
        assert again.returncode == 0 and json.loads(again.stdout)["processes"][0]["pid"] == anvil["pid"]

        # Down stops anvil by pid; up resumes the same chain (same pool, same balances).
        down = run("devnet", "down", "--dir", str(directory))
        assert down.returncode == 0 and "stopped anvil" in down.stdout
        for proc in info["processes"]:
            assert f"stopped {proc['name']}" in down.stdout
            assert not psutil.pid_exists(proc["pid"]) or psutil.Process(proc["pid"]).status() == "zombie"
        resumed = json.loads(run("devnet", "up", "--dir", str(directory), "--json", "--workers", "0").stdout)
        assert resumed["pool_id"] == info["pool_id"]
        client = LedgerClient(resumed["rpc_url"], resumed["deployment"])
        assert client.get_pool(info["pool_id"]).status == PoolStatus.ACTIVE
        assert client.balance_of(provider) == balance
    finally:
        run("devnet", "down", "--dir", str(directory), "--purge")
    assert not directory.exists()


def test_status_without_devnet_names_the_fix(tmp_path: Path) -> None:
    result = run("devnet", "status", "--dir", str(tmp_path / "none"))
    assert result.returncode == 1
    assert "intellect devnet up" in result.stderr
