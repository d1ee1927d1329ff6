"""Bring the local network up and down: anvil, contracts, demo accounts, a domain and a started pool.

Later stages (discovery, orchestrator, workers, validator, trainer) are appended to `SERVICES`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import psutil

from devnet.bootstrap import ROLES, bootstrap
from devnet.hosts import World
from devnet.placement import Placement, destroy_world, world_exists
from devnet.state import DevAccount, DevnetState, ManagedProcess
from devnet.storage import StorageUnavailable, require_moto
from intellect.identity import Wallet
from ledger.client import LedgerClient
from ledger.dev.anvil import Anvil

MAX_WORKERS = 6  # `--demo --pipeline 3`: two groups of 3

Progress = Callable[[str], None]


class DevnetError(Exception):
    pass


def _record(name: str, pid: int, cmd: list[str], log: Path | None, url: str | None) -> ManagedProcess:
    return ManagedProcess(
        name=name,
        pid=pid,
        create_time=psutil.Process(pid).create_time(),
        cmd=cmd,
        log=str(log) if log else None,
        url=url,
    )


def up(
    directory: Path,
    port: int | None = None,
    progress: Progress = print,
    workers: int = 2,
    runtime: str = "process",
    worker_env: dict[int, dict[str, str]] | None = None,
    hosts: bool = False,
    groups: str | None = None,
    link_delay: float = 0.0,
) -> DevnetState:
    """Start (or resume) the devnet in `directory`; idempotent while it is running. `hosts`: every
    process on a host of its own (devnet/hosts.py), workers after the first behind NAT, uploads on a
    storage host (devnet/storage.py). `groups`: a node-group topology the orchestrator forms (e.g.
    `2x0GB`), every worker with a P2P port for its group's links; `link_delay`: seconds every group
    link is held one way (a delay relay in front of each worker's p2p ports)."""
    from devnet.services import start_services

    if not 0 <= workers <= MAX_WORKERS:
        raise DevnetError(f"--workers must be between 0 and {MAX_WORKERS}")
    if runtime not in ("process", "docker", "auto"):
        raise DevnetError(f"--runtime {runtime!r}: use process, docker or auto")
    if hosts and runtime != "process":
        raise DevnetError("--hosts runs tasks with --runtime process (containers are not wired into hosts)")
    state, placement = chain_up(directory, port, progress, hosts)
    if any(p.name != "anvil" and p.alive() for p in state.processes):
        return state
    state.processes = [p for p in state.processes if p.name == "anvil"]
    return start_services(state, workers, runtime, progress, worker_env, placement, groups, link_delay)


def chain_up(
    directory: Path, port: int | None, progress: Progress, hosts: bool
) -> tuple[DevnetState, Placement]:
    """Anvil with the contracts, the demo accounts funded and a started pool (or the saved chain
    resumed); with `hosts`, on a host of a new world (and the storage server is checked first)."""
    if hosts:
        try:
            require_moto()  # before the world and the chain: the storage host is moto's S3 server
        except StorageUnavailable as exc:
            raise DevnetError(str(exc)) from None
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    state = DevnetState.load(directory)
    if state is not None:
        placement = Placement(World.from_record(state.world) if state.world else None)
        if hosts != (state.world is not None):
            raise DevnetError(f"the devnet in {directory} was started {'with' if state.world else 'without'} "
                              "--hosts: `intellect devnet down --purge` first to change that")  # fmt: skip
        recorded = state.process("anvil")
        if recorded and recorded.alive():
            progress("chain already running")
            return state, placement
        if state.world and not world_exists(directory):
            raise DevnetError(f"the hosts of the devnet in {directory} are gone (`down` removes them; a "
                              "--hosts devnet does not resume): `intellect devnet down --purge`, then "
                              "`up --hosts` again")  # fmt: skip
        return _resume(directory, state, progress, placement), placement

    placement = Placement.create(directory) if hosts else Placement()
    if hosts:
        progress("made the hosts' network: namespaces, a bridge, a NAT home router")
    host = placement.host("chain")
    progress("starting anvil")
    chain = Anvil.start(
        port, accounts=len(ROLES), state_path=directory / "anvil-state.json",
        cache_path=directory / "anvil-cache", log_path=directory / "anvil.log", host=placement.bind(host),
        address=placement.address(host), wrap=placement.wrap(host, []),
    )  # fmt: skip
    try:
        wallets = {role: Wallet.from_key(chain.dev_keys[i]) for i, role in enumerate(ROLES)}
        done = bootstrap(chain.rpc_url, wallets, directory, progress)
    except Exception:
        chain.stop()
        raise
    state = DevnetState(
        directory=str(directory),
        rpc_url=chain.rpc_url,
        chain_id=done.chain_id,
        deployment_path=done.deployment_path,
        domain_id=done.domain_id,
        pool_id=done.pool_id,
        accounts=[
            DevAccount(role=role, address=w.address, private_key=w.private_key_hex())
            for role, w in wallets.items()
        ],
        processes=[
            _record("anvil", chain.pid, chain.command, directory / "anvil.log", chain.rpc_url)
        ],
        world=placement.world.record() if placement.world else None,
    )
    state.save()
    return state, placement


def _resume(directory: Path, state: DevnetState, progress: Progress, placement: Placement) -> DevnetState:
    """Restart anvil from its dumped state (same port), keeping every on-chain record."""
    port = int(state.rpc_url.rsplit(":", 1)[1])
    progress("resuming anvil from its saved chain state")
    host = placement.host("chain")
    chain = Anvil.start(
        port, accounts=len(ROLES), state_path=directory / "anvil-state.json",
        cache_path=directory / "anvil-cache", log_path=directory / "anvil.log", host=placement.bind(host),
        address=placement.address(host), wrap=placement.wrap(host, []),
    )  # fmt: skip
    client = LedgerClient(chain.rpc_url, Path(state.deployment_path), check=False)
    try:
        client.check()
    except Exception as exc:
        chain.stop()
        raise DevnetError(
            f"the saved chain in {directory} no longer holds the deployment ({exc}); "
            f"run `intellect devnet down --purge` and start again"
        ) from None
    state.processes = [p for p in state.processes if p.name != "anvil"]
    state.processes.insert(
        0,
        _record("anvil", chain.pid, chain.command, directory / "anvil.log", chain.rpc_url),
    )
    state.save()
    return state


def down(directory: Path, purge: bool = False, progress: Progress = print) -> list[str]:
    """Stop every recorded process (newest first) by pid; `purge` also deletes the chain state."""
    import shutil

    directory = directory.resolve()
    state = DevnetState.load(directory)
    stopped: list[str] = []
    if state is not None:
        for proc in reversed(state.processes):
            if proc.stop():
                progress(f"stopped {proc.name} (pid {proc.pid})")
                stopped.append(proc.name)
        state.processes = []
        state.save()
    for name in destroy_world(directory):
        progress(f"removed host {name}")
    for proc in strays(directory):
        name = " ".join(proc.cmdline()[:2]) if proc.is_running() else str(proc.pid)
        with contextlib.suppress(psutil.Error):
            proc.terminate()
        gone, alive = psutil.wait_procs([proc], timeout=10)
        for left in alive:
            with contextlib.suppress(psutil.Error):
                left.kill()
        progress(f"stopped {name} (pid {proc.pid}, started by this devnet but not recorded)")
        stopped.append(name)
    if purge and directory.exists():
        shutil.rmtree(directory)
        progress(f"removed {directory}")
    return stopped


def strays(directory: Path) -> list[psutil.Process]:
    """Processes this devnet started that its state does not record (an `up` that failed half-way):
    every service it spawns runs with INTELLECT_HOME=<directory>/home; redis-server rewrites its title
    over its environment, so it is known by its working directory, its data folder in the devnet."""
    root = directory.resolve()
    home = str(root / "home")
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid in mine:
                continue
            if proc.environ().get("INTELLECT_HOME") == home:
                found.append(proc)
            elif proc.name().startswith("redis-server") and root in Path(proc.cwd()).parents:
                found.append(proc)  # not a user's shell that happens to sit in the folder
        except psutil.Error:
            continue
    return found
