"""The off-chain half of the devnet: one Redis, discovery, the orchestrator and a few workers.

Each is its own detached process (its console script, configured through its environment), logs to
`<dir>/<name>.log`, and is recorded in devnet.json so `intellect devnet down` stops it by pid.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from devnet.state import DevnetState, ManagedProcess
from intellect.net import free_port, wait_for_port
from intellect.redis_server import redis_server_binary

Progress = Callable[[str], None]
BIN = Path(sys.executable).parent


def _spawn(
    name: str, argv: list[str], env: dict[str, str], directory: Path, url: str | None
) -> ManagedProcess:
    log = directory / f"{name}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # survives the `intellect devnet up` process
        )
    return ManagedProcess(
        name=name,
        pid=proc.pid,
        create_time=psutil.Process(proc.pid).create_time(),
        cmd=argv,
        log=str(log),
        url=url,
    )


def _wait_healthy(proc: ManagedProcess, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited during start-up; see {proc.log}")
        try:
            if httpx.get(f"{proc.url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{proc.name} did not become healthy in {timeout:.0f}s; see {proc.log}")


def _base_env(directory: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_")}
    return env | {"INTELLECT_HOME": str(directory / "home"), "PYTHONUNBUFFERED": "1"}


def start_services(
    state: DevnetState, workers: int, runtime: str, progress: Progress,
    worker_env: dict[int, dict[str, str]] | None = None,
) -> DevnetState:  # fmt: skip
    """Redis, discovery, the orchestrator and `workers` workers; `worker_env[i]` is worker i's extra
    environment (the demo's cheating operator sets its task environment there)."""
    directory = Path(state.directory)
    env = _base_env(directory)
    procs: list[ManagedProcess] = []

    progress("starting redis")
    port = free_port()
    redis_dir = directory / "redis"
    redis_dir.mkdir(exist_ok=True)
    redis = _spawn(
        "redis",
        [
            str(redis_server_binary()),
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--dir",
            str(redis_dir),
            "--appendonly",
            "yes",
            "--save",
            "",
        ],
        env,
        directory,
        f"redis://127.0.0.1:{port}/0",
    )
    procs.append(redis)
    wait_for_port("127.0.0.1", port)

    progress("starting discovery")
    port = free_port()
    discovery = _spawn(
        "discovery",
        [str(BIN / "intellect-discovery"), "serve"],
        env
        | {
            "INTELLECT_DISCOVERY_PORT": str(port),
            "INTELLECT_DISCOVERY_REDIS_URL": redis.url or "",
            "INTELLECT_DISCOVERY_RPC_URL": state.rpc_url,
            "INTELLECT_DISCOVERY_DEPLOYMENT": state.deployment_path,
            "INTELLECT_DISCOVERY_STATE_DIR": str(directory / "discovery"),
            "INTELLECT_DISCOVERY_POOL_ID": str(state.pool_id),
        },
        directory,
        f"http://127.0.0.1:{port}",
    )
    procs.append(discovery)
    _wait_healthy(discovery)

    progress("starting the orchestrator")
    port = free_port()
    orchestrator = _spawn(
        "orchestrator",
        [str(BIN / "intellect-orchestrator"), "serve"],
        env
        | {
            "INTELLECT_ORCH_PORT": str(port),
            "INTELLECT_ORCH_POOL_ID": str(state.pool_id),
            "INTELLECT_ORCH_REDIS_URL": redis.url or "",
            "INTELLECT_ORCH_RPC_URL": state.rpc_url,
            "INTELLECT_ORCH_DEPLOYMENT": state.deployment_path,
            "INTELLECT_ORCH_STATE_DIR": str(directory / "orchestrator"),
            "INTELLECT_ORCH_DISCOVERY_URL": discovery.url or "",
            "INTELLECT_ORCH_MANAGER_KEY": state.account("pool-manager").private_key,
            "INTELLECT_ORCH_INVITE_INTERVAL_SECONDS": "2",
        },
        directory,
        f"http://127.0.0.1:{port}",
    )
    procs.append(orchestrator)
    _wait_healthy(orchestrator)

    for index in range(1, workers + 1):
        progress(f"starting worker {index}")
        port = free_port()
        worker = _spawn(
            f"worker-{index}",
            [str(BIN / "intellect-worker"), "start", "--yes", "--runtime", runtime, "--api-port", str(port)],
            env
            | {
                "INTELLECT_WORKER_PROVIDER_KEY": state.account(f"provider-{index}").private_key,
                "INTELLECT_WORKER_NODE_KEY": state.account(f"node-{index}").private_key,
                "INTELLECT_WORKER_RPC_URL": state.rpc_url,
                "INTELLECT_WORKER_DEPLOYMENT": state.deployment_path,
                "INTELLECT_WORKER_DISCOVERY_URL": discovery.url or "",
                "INTELLECT_WORKER_POOL_ID": str(state.pool_id),
                "INTELLECT_WORKER_STATE_DIR": str(directory / f"worker-{index}"),
                "INTELLECT_WORKER_METADATA_REFRESH": "5",
                "INTELLECT_WORKER_MIN_DISK_MB": "0",
                "INTELLECT_WORKER_STOP_TASKS_ON_EXIT": "1",  # `devnet down` leaves no task behind
                # Everything here listens on loopback: task containers share the host's network.
                "INTELLECT_WORKER_TASK_NETWORK": "host",
            }
            | (worker_env or {}).get(index, {}),
            directory,
            f"http://127.0.0.1:{port}",
        )
        procs.append(worker)
    for worker in procs[3:]:
        _wait_healthy(worker)

    state.processes.extend(procs)
    state.save()
    return state
