"""A contributor's new wallet on a devnet (issue 24): `check` says what money is missing and how to
get it, `start` without gas says so in words (no raw RPC error), `intellect devnet fund` provides it,
and then `check` is green; addresses print whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def run(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "80", **(env or {})})


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict]]:
    directory = tmp_path_factory.mktemp("fund") / "devnet"
    up = run("intellect", "devnet", "up", "--dir", str(directory), "--workers", "0", "--json")
    assert up.returncode == 0, up.stderr
    yield directory, json.loads(up.stdout)
    run("intellect", "devnet", "down", "--dir", str(directory))


def test_a_new_wallet_is_told_how_to_get_funded(devnet: tuple[Path, dict], tmp_path: Path) -> None:
    directory, info = devnet
    env = {"INTELLECT_KEYSTORE_PASSPHRASE": "correct horse",
           "INTELLECT_WORKER_STATE_DIR": str(tmp_path / "w"),
           "INTELLECT_WORKER_RPC_URL": info["rpc_url"], "INTELLECT_WORKER_DEPLOYMENT": info["deployment"],
           "INTELLECT_WORKER_POOL_ID": str(info["pool_id"]), "INTELLECT_WORKER_MIN_DISK_MB": "0"}
    created = run("intellect-worker", "wallet", "create", env=env)
    assert created.returncode == 0, created.stderr
    keys = json.loads(run("intellect-worker", "wallet", "show", "--json", env=env).stdout)
    provider = next(k["address"] for k in keys if k["role"] == "provider")
    assert provider in created.stdout.replace("\n", "")  # whole, even in an 80-column terminal

    check = run("intellect-worker", "check", "--json", env=env)
    assert check.returncode == 1
    rows = {c["name"]: c for c in json.loads(check.stdout)["checks"]}
    assert not rows["gas"]["ok"] and f"intellect devnet fund {provider}" in rows["gas"]["detail"]
    assert not rows["stake"]["ok"] and "the registry asks a stake of" in rows["stake"]["detail"]
    assert not rows["whitelist"]["ok"] and "whitelist-provider" in rows["whitelist"]["detail"]

    start = run("intellect-worker", "start", "--yes", "--api-port", "0", env=env, timeout=120)
    assert start.returncode != 0
    assert f"intellect devnet fund {provider}" in start.stdout + start.stderr  # no tokens: says how
    tokens_only = run("intellect", "devnet", "fund", provider, "--eth", "0", "--no-whitelist",
                      "--dir", str(directory))
    assert tokens_only.returncode == 0, tokens_only.stderr
    start = run("intellect-worker", "start", "--yes", "--api-port", "0", env=env, timeout=120)
    assert start.returncode != 0
    said = start.stdout + start.stderr
    assert "cannot pay for gas" in said and provider in said, said[-2000:]
    assert "-32003" not in said and "Traceback" not in said

    funded = run("intellect", "devnet", "fund", provider, "--tokens", "0", "--dir", str(directory))
    assert funded.returncode == 0 and provider in funded.stdout, funded.stderr
    check = run("intellect-worker", "check", "--json", env=env)
    assert check.returncode == 0, check.stdout
    rows = {c["name"]: c for c in json.loads(check.stdout)["checks"]}
    assert rows["gas"]["ok"] and rows["stake"]["ok"] and rows["whitelist"]["ok"]
