"""The off-chain half of the devnet: one Redis, discovery, the orchestrator and a few workers; with
`up --hosts` also a storage host (an S3 server, devnet/storage.py) the orchestrator keeps uploads on.

Each is its own detached process started by devnet/processes.py, so `intellect devnet down` stops it
by pid and `intellect devnet restart NAME` starts it again as it was.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from devnet.hosts import Host
from devnet.placement import Placement
from devnet.processes import BIN, base_env, spawn, wait_healthy
from devnet.state import DevnetState, ManagedProcess
from devnet.storage import start_storage
from intellect.net import stable_port, wait_for_port
from intellect.redis_server import redis_server_binary

Progress = Callable[[str], None]


@dataclass
class WorkerSpec:
    """How one worker runs: its task runtime, extra environment (the demo's cheating operator sets its
    task environment there), whether it sits behind the home router, whether it has P2P ports for a
    node group's links (each held `link_delay` seconds one way), and `program`: a cheating client
    (devnet/cheaters.py) instead of the honest `intellect-worker`."""

    runtime: str = "process"
    env: dict[str, str] = field(default_factory=dict)
    nat: bool = False
    p2p: bool = False
    link_delay: float = 0.0
    program: str | None = None


def start_services(
    state: DevnetState, workers: int, runtime: str, progress: Progress,
    worker_env: dict[int, dict[str, str]] | None = None, placement: Placement | None = None,
    groups: str | None = None, link_delay: float = 0.0,
) -> DevnetState:  # fmt: skip
    """Redis, discovery, the orchestrator and `workers` workers; `worker_env[i]` is worker i's extra
    environment. `placement`: each on a host of its own (`up --hosts`), worker 1 public and the others
    behind the home router, and the uploads on a storage host of their own, so worker ↔ storage is a
    link apart from worker ↔ orch. `groups`: the topology the orchestrator forms, every worker with P2P
    ports (`link_delay`: their links answered by delay relays, `link_relays`)."""
    where = placement or Placement()
    start_core(state, where, progress, [groups] if groups else [])
    specs = {index: WorkerSpec(runtime=runtime, env=(worker_env or {}).get(index, {}),
                               nat=behind_nat(index, workers, groups), p2p=bool(groups),
                               link_delay=link_delay) for index in range(1, workers + 1)}  # fmt: skip
    start_workers(state, where, specs, progress)
    return state


def start_core(state: DevnetState, where: Placement, progress: Progress, topologies: list[str],
               orchestrator_env: dict[str, str] | None = None) -> None:  # fmt: skip
    """Redis, discovery, (with hosts) the storage host, and the orchestrator forming groups of
    `topologies` (`orchestrator_env`: settings of its own); recorded in the state as each answers."""
    directory = Path(state.directory)
    env = base_env(directory)
    redis = _start_redis(where, env, directory, progress)
    state.processes.append(redis)
    discovery = _start_discovery(state, where, env, redis, progress)
    state.processes.append(discovery)
    storage_env: dict[str, str] = {}  # on loopback: the orchestrator's embedded disk storage
    if where.world is not None:
        storage, storage_env = start_storage(where, env, directory, progress)
        state.processes.append(storage)
    state.processes.append(_start_orchestrator(state, where, env | storage_env | (orchestrator_env or {}),
                                               redis, discovery, topologies, progress))  # fmt: skip
    if where.world is not None:
        state.world = where.world.record()
    state.save()


def _start_redis(where: Placement, env: dict[str, str], directory: Path,
                 progress: Progress) -> ManagedProcess:  # fmt: skip
    progress("starting redis")
    port = stable_port()
    redis_dir = directory / "redis"
    redis_dir.mkdir(exist_ok=True)
    host = where.host("redis")
    argv = [str(redis_server_binary()), "--bind", where.bind(host), "--port", str(port),
            "--dir", str(redis_dir), "--appendonly", "yes", "--save", ""]  # fmt: skip
    if host:
        argv += ["--protected-mode", "no"]  # reachable from the other hosts, as a pool's Redis would be
    redis = spawn("redis", where.wrap(host, argv), env, directory, f"redis://{where.address(host)}:{port}/0")
    wait_for_port(where.address(host), port)
    return redis


def _start_discovery(state: DevnetState, where: Placement, env: dict[str, str], redis: ManagedProcess,
                     progress: Progress) -> ManagedProcess:  # fmt: skip
    progress("starting discovery")
    directory = Path(state.directory)
    port = stable_port()
    host = where.host("discovery")
    discovery = spawn("discovery", where.wrap(host, [str(BIN / "intellect-discovery"), "serve"]), env | {
        "INTELLECT_DISCOVERY_HOST": where.bind(host),
        "INTELLECT_DISCOVERY_PORT": str(port),
        "INTELLECT_DISCOVERY_REDIS_URL": redis.url or "",
        "INTELLECT_DISCOVERY_RPC_URL": state.rpc_url,
        "INTELLECT_DISCOVERY_DEPLOYMENT": state.deployment_path,
        "INTELLECT_DISCOVERY_STATE_DIR": str(directory / "discovery"),
        "INTELLECT_DISCOVERY_POOL_ID": str(state.pool_id),
    }, directory, f"http://{where.address(host)}:{port}")  # fmt: skip
    wait_healthy(discovery)
    return discovery


def _start_orchestrator(state: DevnetState, where: Placement, env: dict[str, str], redis: ManagedProcess,
                        discovery: ManagedProcess, topologies: list[str],
                        progress: Progress) -> ManagedProcess:  # fmt: skip
    progress("starting the orchestrator")
    directory = Path(state.directory)
    port = stable_port()
    host = where.host("orch")
    url = f"http://{where.address(host)}:{port}"
    argv = where.wrap(host, [str(BIN / "intellect-orchestrator"), "serve"])
    orchestrator = spawn("orchestrator", argv, env | {
        "INTELLECT_ORCH_HOST": where.bind(host),
        "INTELLECT_ORCH_PORT": str(port),
        "INTELLECT_ORCH_PUBLIC_URL": url,
        "INTELLECT_ORCH_POOL_ID": str(state.pool_id),
        "INTELLECT_ORCH_REDIS_URL": redis.url or "",
        "INTELLECT_ORCH_RPC_URL": state.rpc_url,
        "INTELLECT_ORCH_DEPLOYMENT": state.deployment_path,
        "INTELLECT_ORCH_STATE_DIR": str(directory / "orchestrator"),
        "INTELLECT_ORCH_DISCOVERY_URL": discovery.url or "",
        "INTELLECT_ORCH_MANAGER_KEY": state.key_ref("pool-manager"),
        "INTELLECT_ORCH_INVITE_INTERVAL_SECONDS": "2",
    } | ({"INTELLECT_ORCH_TOPOLOGY_NAMES": json.dumps(topologies)} if topologies else {}),
        directory, url)  # fmt: skip
    wait_healthy(orchestrator)
    return orchestrator


def start_workers(state: DevnetState, where: Placement, specs: dict[int, WorkerSpec],
                  progress: Progress) -> None:  # fmt: skip
    """Workers `specs` (index → how it runs), each on its host (`w<index>`) with its role's keys; waits
    until each answers (or, behind NAT, has started) and records them."""
    directory = Path(state.directory)
    discovery, started = state.process("discovery"), []
    for index, spec in specs.items():
        progress(f"starting worker {index}")
        port = stable_port()
        host = where.host(f"w{index}", nat=spec.nat)
        relays: list[ManagedProcess] = []
        argv = [str(BIN / "intellect-worker"), "start", "--yes", "--runtime", spec.runtime,
                "--api-port", str(port)]  # fmt: skip
        if spec.program is not None:
            from devnet.cheaters import cheater_argv

            argv = cheater_argv(spec.program, argv)
        p2p = p2p_env(index, host, where, directory, relays, spec.link_delay) if spec.p2p else {}
        worker = spawn(
            f"worker-{index}", where.wrap(host, argv),
            base_env(directory) | worker_settings(state, index, host, where, discovery) | p2p | spec.env,
            directory,
            # behind the home router nobody can call it, this machine neither: its health is its heartbeat
            f"http://{where.address(host)}:{port}" if where.reachable(host) else None,
        )  # fmt: skip
        state.processes.extend([*relays, worker])
        started.append(worker)
    for worker in started:
        wait_healthy(worker)
    if where.world is not None:
        state.world = where.world.record()
    state.save()


def worker_settings(state: DevnetState, index: int, host: Host | None, where: Placement,
                    discovery: ManagedProcess | None) -> dict[str, str]:  # fmt: skip
    """Worker `index`'s own settings: its keys, the chain, discovery and the pool, and the devnet's
    short timings."""
    return {
        "INTELLECT_WORKER_API_HOST": where.bind(host),
        "INTELLECT_WORKER_ADVERTISED_IP": where.address(host),
        "INTELLECT_WORKER_PROVIDER_KEY": state.key_ref(f"provider-{index}"),
        "INTELLECT_WORKER_NODE_KEY": state.key_ref(f"node-{index}"),
        "INTELLECT_WORKER_RPC_URL": state.rpc_url,
        "INTELLECT_WORKER_DEPLOYMENT": state.deployment_path,
        "INTELLECT_WORKER_DISCOVERY_URL": discovery.url or "" if discovery else "",
        "INTELLECT_WORKER_POOL_ID": str(state.pool_id),
        "INTELLECT_WORKER_STATE_DIR": str(Path(state.directory) / f"worker-{index}"),
        "INTELLECT_WORKER_METADATA_REFRESH": "5",
        "INTELLECT_WORKER_MIN_DISK_MB": "0",
        # files go on chain in batches (a few per transaction, none waiting more than 1 s: the trainer's
        # next step waits for them; at 4 s, 40 steps took ~60 s longer)
        "INTELLECT_WORKER_SUBMIT_BATCH_FILES": "8",
        "INTELLECT_WORKER_SUBMIT_BATCH_AGE": "1",
        "INTELLECT_WORKER_STOP_TASKS_ON_EXIT": "1",  # `devnet down` leaves no task behind
        # Everything here listens on loopback: task containers share the host's network.
        "INTELLECT_WORKER_TASK_NETWORK": "host",
    }


def p2p_env(index: int, host: Host | None, where: Placement, directory: Path, procs: list[ManagedProcess],
            link_delay: float) -> dict[str, str]:  # fmt: skip
    """Worker `index`'s p2p ports: its inbox and, for a next member behind NAT, its listening outbox (the
    port after). With `link_delay`, peers are told ports where two delay relays (`python -m
    intellect.links`, on the worker's host) listen, and the worker's tasks bind the ports behind them:
    every hop of a group's ring is held `link_delay` seconds one way, by the relay of its listening end."""
    advertised = stable_port(span=2)
    if not link_delay:
        return {"INTELLECT_WORKER_P2P_PORT": str(advertised)}
    bound = stable_port(span=2)
    delay = f"{link_delay * 1000:g}ms"
    for offset, name in ((0, f"link-{index}"), (1, f"link-{index}-out")):
        argv = [sys.executable, "-m", "intellect.links", "--listen",
                f"{where.bind(host)}:{advertised + offset}", "--target", f"127.0.0.1:{bound + offset}",
                "--delay", delay]  # fmt: skip
        procs.append(spawn(name, where.wrap(host, argv), base_env(directory), directory, None))
    return {"INTELLECT_WORKER_P2P_PORT": str(advertised), "INTELLECT_WORKER_P2P_BIND_PORT": str(bound)}


def behind_nat(index: int, workers: int, groups: str | None) -> bool:
    """Whether worker `index` sits behind the home router (`up --hosts`): every worker after the first,
    or, when the orchestrator forms groups (`groups`), only the last. A ring needs one end of each link
    that can be called, so it carries at most half its members behind NAT, and formation takes nodes with
    proven hardware first (the orchestrator cannot challenge a node it cannot call): the nodes behind NAT
    all come last, and more than one of them would be left without a group to join."""
    return index == workers and workers > 1 if groups else index > 1
