"""Starting, health-checking and restarting the devnet's detached processes.

Each service is its own process (its console script, configured through its environment), logs to
`<dir>/<name>.log`, and is recorded in devnet.json with its command and its own settings, so that
`intellect devnet down` stops it by pid and `intellect devnet restart NAME` starts it again exactly as
`up` did: same command, same port, same state directory.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil

from devnet.state import DevnetState, ManagedProcess

BIN = Path(sys.executable).parent
OWN_ENV_PREFIXES = ("INTELLECT_", "OMP_", "PYTHONUNBUFFERED", "AWS_")
"""Environment variables a service is configured by: recorded per process so a restart reuses them
(AWS_*: the orchestrator's credentials for the storage host of `up --hosts`, devnet/storage.py)."""


class RestartError(Exception):
    """A process could not be restarted; the message says which and what to do."""


def base_env(directory: Path) -> dict[str, str]:
    """The caller's environment without its INTELLECT_* settings, plus the devnet's home. Without its
    AWS_* too: the devnet's storage is its own, and a caller's real credentials must neither reach its
    processes nor be recorded with them in devnet.json."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INTELLECT_", "AWS_"))}
    return env | {"INTELLECT_HOME": str(directory / "home"), "PYTHONUNBUFFERED": "1"}


def spawn(
    name: str, argv: list[str], env: dict[str, str], directory: Path, url: str | None
) -> ManagedProcess:
    """Start `argv` detached (its own session: it outlives `devnet up`), logging to `<dir>/<name>.log`."""
    log = directory / f"{name}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    return ManagedProcess(
        name=name,
        pid=proc.pid,
        create_time=psutil.Process(proc.pid).create_time(),
        cmd=argv,
        env={k: v for k, v in env.items() if k.startswith(OWN_ENV_PREFIXES)},
        log=str(log),
        url=url,
    )


def wait_healthy(proc: ManagedProcess, timeout: float = 90.0) -> None:
    """Wait until `proc.url`/health answers 200 (or, for Redis/anvil, their port accepts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited during start-up; see {proc.log}")
        if proc.url is None or _answers(proc.name, proc.url):
            return
        time.sleep(0.25)
    raise RuntimeError(f"{proc.name} did not become healthy in {timeout:.0f}s; see {proc.log}")


def _answers(name: str, url: str) -> bool:
    """Redis answers PING, anvil eth_chainId, the S3 storage host (moto) GET /moto-api/, every other
    service GET /health."""
    try:
        if url.startswith("redis://"):
            from redis import Redis

            with Redis.from_url(url, socket_timeout=2) as client:
                return bool(client.ping())
        if name == "anvil":
            body = {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"}
            return httpx.post(url, json=body, timeout=2).status_code == 200
        if name == "storage":
            return httpx.get(f"{url}/moto-api/", timeout=2).status_code == 200
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except Exception:  # not up yet: any transport or protocol error
        return False


PROBE = "import socket, sys; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); " \
    "s.bind(('0.0.0.0', int(sys.argv[1])))"


def _port_free(host: str, port: int, netns: str | None) -> bool:
    """Whether `port` can be bound again where the process ran: this machine, or inside its host's
    network namespace (`up --hosts`), where its address exists and this machine's does not."""
    if netns is not None:
        probe = ["ip", "netns", "exec", netns, sys.executable, "-c", PROBE, str(port)]
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return True
        except OSError:
            return False


def _wait_port_free(url: str, timeout: float, cmd: list[str] | None = None) -> None:
    """Until the old process's port can be bound again, so the new one does not die on "Address already
    in use"; a port still held after `timeout` is named with its holder."""
    parsed = urlsplit(url)
    if parsed.port is None:
        return
    netns = cmd[3] if cmd and len(cmd) > 3 and cmd[:3] == ["ip", "netns", "exec"] else None
    deadline = time.monotonic() + timeout
    while not _port_free(parsed.hostname or "127.0.0.1", parsed.port, netns):
        if time.monotonic() > deadline:
            holders = [c.pid for c in psutil.net_connections("tcp")
                       if c.laddr and c.laddr.port == parsed.port and c.status == "LISTEN"]  # fmt: skip
            where = f" in {netns}" if netns else ""
            raise RestartError(f"port {parsed.port}{where} is still held (pid {holders or 'unknown'}) "
                               f"{timeout:.0f} s after the old process stopped")  # fmt: skip
        time.sleep(0.1)


def restart(state: DevnetState, name: str, *, kill: bool = False, timeout: float = 180.0) -> ManagedProcess:
    """Stop process `name` (SIGTERM, or SIGKILL with `kill`, as a crash would) and start it again with
    the command and settings `up` gave it; waits until it answers. Returns the new record (saved)."""
    old = state.process(name)
    if old is None:
        known = ", ".join(p.name for p in state.processes) or "none"
        raise RestartError(f"no process named {name!r} in this devnet (known: {known})")
    if not old.cmd:
        raise RestartError(f"{name} was recorded without its command; `intellect devnet down` and `up` again")
    if kill:
        old.kill()
    else:
        old.stop()
    directory = Path(state.directory)
    env = base_env(directory) | old.env
    if old.url:
        _wait_port_free(old.url, timeout=min(timeout, 15.0), cmd=old.cmd)
    new = spawn(name, old.cmd, env, directory, old.url)
    state.processes = [new if p.name == name else p for p in state.processes]
    state.save()
    try:
        wait_healthy(new, timeout)
    except RuntimeError as exc:
        raise RestartError(str(exc)) from None
    return new
