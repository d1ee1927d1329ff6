"""Orchestrator replicas behind HAProxy, for `bench/heartbeats.py --replicas N`.

The replicas share one Redis and one PostgreSQL database, as `tests/orchestrator/test_replicas.py`
runs them (each runs its loops; one leads at a time). HAProxy from Debian's packages (`make
bench-tools`) balances TCP connections round robin: a heartbeat is one request on a connection, so
with kept-alive connections the balance is per connection, which is what a fleet of workers gives it.

`Fleet` answers the bench's questions (CPU by role, a node's state, stop) the way one `Server` does,
with the balancer's CPU counted as server CPU: it is part of what the pool pays per heartbeat.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Protocol

import psutil

from intellect.processes import stop_process

CONFIG = """global
    maxconn 8000
    nbthread 1
defaults
    mode tcp
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend heartbeats
    bind 127.0.0.1:{port}
    default_backend replicas
backend replicas
    balance roundrobin
{servers}
"""


class Replica(Protocol):
    url: str
    log: Path

    def cpu_by_role(self) -> dict[str, float]: ...

    def node_state(self, address: str) -> str: ...

    def stop(self) -> None: ...


def haproxy_binary() -> str:
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if found is None:
        raise SystemExit("haproxy is not installed: `make bench-tools` (Debian's haproxy) first")
    return found


class HAProxy:
    """One haproxy process in the foreground (-db), stopped by pid."""

    def __init__(self, port: int, backends: list[int], state_dir: Path) -> None:
        self.port = port
        config = state_dir / "haproxy.cfg"
        servers = "\n".join(f"    server r{i} 127.0.0.1:{p}" for i, p in enumerate(backends))
        config.write_text(CONFIG.format(port=port, servers=servers))
        self.log = state_dir / "haproxy.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen([haproxy_binary(), "-db", "-f", str(config)],
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"haproxy did not start (its log: {self.log})")
            time.sleep(0.1)

    def cpu_seconds(self) -> float:
        with contextlib.suppress(psutil.NoSuchProcess):
            return sum(psutil.Process(self.proc.pid).cpu_times()[:2])
        return 0.0

    def stop(self) -> None:
        stop_process(self.proc, grace=10)


class Fleet:
    """N replicas and the balancer in front of them, seen by the bench as one server at `url`."""

    def __init__(self, replicas: list[Replica], balancer: HAProxy) -> None:
        self.replicas, self.balancer = replicas, balancer
        self.url = f"http://127.0.0.1:{balancer.port}"
        self.log = replicas[0].log

    def cpu_by_role(self) -> dict[str, float]:
        out = {"api": 0.0, "other": 0.0}
        for replica in self.replicas:
            for role, seconds in replica.cpu_by_role().items():
                out[role] += seconds
        out["balancer"] = self.balancer.cpu_seconds()
        return out

    def node_state(self, address: str) -> str:
        return self.replicas[0].node_state(address)

    def stop(self) -> None:
        self.balancer.stop()
        for replica in self.replicas:
            replica.stop()
