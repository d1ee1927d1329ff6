"""`intellect-worker` commands through typer's CliRunner, against a real chain where they need one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner
from worker_devnet import Devnet

from intellect.identity import Wallet
from worker.chain import WorkerChain
from worker.cli import app
from worker.keys import WorkerKeys

runner = CliRunner()


def env_for(devnet: Devnet | None, state: Path, **extra: str) -> dict[str, str]:
    env = {"INTELLECT_WORKER_STATE_DIR": str(state), "INTELLECT_KEYSTORE_PASSPHRASE": "pw"}
    if devnet:
        env |= {
            "INTELLECT_WORKER_RPC_URL": devnet.rpc_url,
            "INTELLECT_WORKER_DEPLOYMENT": str(devnet.deployment_path),
            "INTELLECT_WORKER_POOL_ID": str(devnet.pool_id),
        }
    return env | extra


@pytest.mark.slow  # starts other interpreters (see tests/conftest.py)
def test_wallet_create_show_import(tmp_path: Path) -> None:
    env = env_for(None, tmp_path)
    created = runner.invoke(app, ["wallet", "create", "--json"], env=env)
    assert created.exit_code == 0, created.output
    rows = json.loads(created.stdout)
    assert [r["role"] for r in rows] == ["provider", "node"] and all(r["created"] for r in rows)
    shown = runner.invoke(app, ["wallet", "show", "--json"], env=env)
    assert [r["address"] for r in json.loads(shown.stdout)] == [r["address"] for r in rows]
    assert "private_key" not in shown.stdout
    secret = runner.invoke(app, ["wallet", "show", "--json", "--show-private-key"], env=env)
    keys = json.loads(secret.stdout)
    assert Wallet.from_key(keys[1]["private_key"]).address == rows[1]["address"]
    # Creating again keeps the existing keys.
    again = json.loads(runner.invoke(app, ["wallet", "create", "--json"], env=env).stdout)
    assert [r["address"] for r in again] == [r["address"] for r in rows] and not any(
        r["created"] for r in again
    )
    other = Wallet.create()
    refused = runner.invoke(
        app, ["wallet", "import", "--role", "node", "--private-key", other.private_key_hex()], env=env
    )
    assert refused.exit_code == 1 and "--force" in refused.output
    ok = runner.invoke(
        app,
        ["wallet", "import", "--role", "node", "--force", "--json", "--private-key", other.private_key_hex()],
        env=env,
    )
    assert ok.exit_code == 0 and json.loads(ok.stdout)[0]["address"] == other.address
    bad = runner.invoke(
        app, ["wallet", "import", "--role", "node", "--force", "--private-key", "0x12"], env=env
    )
    assert bad.exit_code == 1 and "not a valid private key" in bad.output
    # Help and error name the same roles: one key at a time, never "both".
    for role in ("both", "nodes"):
        args = ["wallet", "import", "--role", role, "--private-key", other.private_key_hex()]
        wrong = runner.invoke(app, args, env=env)
        assert wrong.exit_code == 1 and "--role must be provider or node" in wrong.output
        assert "both" not in wrong.output
    assert "both" not in runner.invoke(app, ["wallet", "import", "--help"], env=env).output


def test_check_exit_codes(tmp_path: Path) -> None:
    ok = runner.invoke(app, ["check", "--offline", "--json"], env=env_for(None, tmp_path))
    assert ok.exit_code == 0, ok.output
    report = json.loads(ok.stdout)
    assert report["ok"] and report["specs"]["cpu_cores"] >= 1
    full = runner.invoke(
        app, ["check"], env=env_for(None, tmp_path, INTELLECT_WORKER_MIN_DISK_MB=str(10**12))
    )
    assert full.exit_code == 1 and "FAIL" in full.stdout


def test_check_reads_the_pools_requirements(devnet: Devnet, tmp_path: Path) -> None:
    gpu_pool = devnet.admin.create_pool(
        devnet.domain_id,
        devnet.manager.address,
        "gpu",
        '{"requirements": {"gpu": {"count": 8, "memory_mb": 80000}}}',
        0,
    )
    res = runner.invoke(app, ["check", "--json", "--pool-id", str(gpu_pool)], env=env_for(devnet, tmp_path))
    assert res.exit_code == 1
    failed = [c for c in json.loads(res.stdout)["checks"] if not c["ok"] and c["blocking"]]
    assert [c["name"] for c in failed] == ["gpu"] and "8 GPU(s)" in failed[0]["detail"]
    rows = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert rows["cpu"]["ok"] and rows["ram"]["ok"]  # only the gpu row carries the mismatch


def test_check_fails_when_the_named_pool_cannot_be_read(devnet: Devnet, tmp_path: Path) -> None:
    missing = runner.invoke(app, ["check", "--json", "--pool-id", "99"], env=env_for(devnet, tmp_path))
    assert missing.exit_code == 1
    pool_row = next(c for c in json.loads(missing.stdout)["checks"] if c["name"] == "pool")
    assert not pool_row["ok"] and "PoolNotFound" in pool_row["detail"]
    dead = runner.invoke(app, ["check", "--json", "--rpc-url", "http://127.0.0.1:9"],
                         env=env_for(devnet, tmp_path))
    assert dead.exit_code == 1
    assert not next(c for c in json.loads(dead.stdout)["checks"] if c["name"] == "pool")["ok"]


def test_start_refuses_an_unfunded_provider_without_spending(devnet: Devnet, tmp_path: Path) -> None:
    poor = devnet.fresh_provider(tokens=0)
    env = env_for(
        devnet,
        tmp_path,
        INTELLECT_WORKER_PROVIDER_KEY=poor.private_key_hex(),
        INTELLECT_WORKER_NODE_KEY=Wallet.create().private_key_hex(),
    )
    res = runner.invoke(app, ["start", "--yes", "--api-port", "0"], env=env)
    assert res.exit_code == 1 and "fund it first" in res.output


def test_start_refuses_a_machine_below_the_pools_requirements(devnet: Devnet, tmp_path: Path) -> None:
    big = devnet.admin.create_pool(
        devnet.domain_id, devnet.manager.address, "big", '{"ram_mb": 999999999}', 0
    )
    env = env_for(
        devnet,
        tmp_path,
        INTELLECT_WORKER_PROVIDER_KEY=devnet.fresh_provider().private_key_hex(),
        INTELLECT_WORKER_NODE_KEY=Wallet.create().private_key_hex(),
    )
    res = runner.invoke(app, ["start", "--yes", "--pool-id", str(big)], env=env)
    assert res.exit_code == 1 and "cannot join pool" in res.output and "RAM" in res.output


def test_balance_status_and_deregister(devnet: Devnet, tmp_path: Path) -> None:
    provider, node = devnet.fresh_provider(), Wallet.create()
    WorkerChain(devnet.rpc_url, devnet.deployment_path, WorkerKeys(provider, node)).ensure_registered(
        1, None, lambda plan: True
    )
    env = env_for(
        devnet,
        tmp_path,
        INTELLECT_WORKER_PROVIDER_KEY=provider.private_key_hex(),
        INTELLECT_WORKER_NODE_KEY=node.private_key_hex(),
    )
    bal = json.loads(runner.invoke(app, ["balance", "--json"], env=env).stdout)
    assert bal["registered"] and bal["stake"] == 20 * 10**18
    assert bal["balances"][0]["tokens"] == 980 * 10**18 and bal["balances"][0]["eth_wei"] > 0
    status = json.loads(runner.invoke(app, ["status", "--json"], env=env).stdout)
    pool = status["chain"]["pool"]
    assert status["chain"]["node_registered"] and pool["member"] is False and "not in pool" in pool["reason"]
    res = runner.invoke(app, ["deregister", "--yes", "--json"], env=env)
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)["transactions"]) == 2  # remove node, deregister provider
    after = json.loads(runner.invoke(app, ["status", "--json"], env=env).stdout)
    assert not after["chain"]["node_registered"]


def test_start_without_a_runtime_flag_runs_tasks(
    devnet: Devnet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24: `start` with no --runtime used to record tasks and run nothing. Now: auto, a runtime
    that runs them (Docker when an engine answers, else processes), as `check` promises."""
    from worker import cli as worker_cli
    from worker.runtime import DockerRuntime, ProcessRuntime, RecordingRuntime

    given: list[Any] = []

    class Daemon:  # stands in for the daemon: keep the runtime `start` built, serve nothing
        def __init__(self, settings, keys, chain, runtime, *rest) -> None:  # noqa: ANN001
            given.append(runtime)

        async def run(self) -> None:
            given[-1].close()  # stops the bridge `start` opened with the runtime

    monkeypatch.setattr(worker_cli, "WorkerDaemon", Daemon)
    env = env_for(devnet, tmp_path, INTELLECT_WORKER_PROVIDER_KEY=devnet.fresh_provider().private_key_hex(),
                  INTELLECT_WORKER_NODE_KEY=Wallet.create().private_key_hex())
    res = runner.invoke(app, ["start", "--yes", "--api-port", "0"], env=env)
    assert res.exit_code == 0, res.output
    [runtime] = given
    assert isinstance(runtime, (DockerRuntime, ProcessRuntime)) and not isinstance(runtime, RecordingRuntime)
