"""Small networking helpers shared by services and tests."""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path

# Below this, ports are left to well-known services; the kernel's ephemeral range starts above.
STABLE_PORTS_FROM = 10_000


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free right now on `host`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it hands out itself (port-0 binds, outgoing connections)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _bindable(host: str, port: int) -> bool:
    # No SO_REUSEADDR: a socket that is bound (listening or not, or an outgoing connection's local
    # end) on the port makes this fail.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def stable_port(host: str = "0.0.0.0", span: int = 1, attempts: int = 500) -> int:
    """A port, free now with its `span - 1` neighbours above it, for a listener that is recorded and
    bound again later (a service restarted on its port, a worker's p2p inbox that each group task
    binds while it runs): outside the kernel's ephemeral range. A port from `free_port` is an
    ephemeral one, and while its owner is down any outgoing connection on the machine may take it as
    its local port (a pooled HTTP or Redis connection keeps it for minutes), and the owner's next bind
    fails (a zmq bind on such a port: tests/shared/test_net.py). Two callers asking at once may still
    be given the same port; each binds it for real later, and the second gets a clear bind error."""
    low, _ = ephemeral_range()
    floor = STABLE_PORTS_FROM if low - span > STABLE_PORTS_FROM + 1000 else 1024
    for _ in range(attempts):
        port = random.randrange(floor, low - span + 1)
        if all(_bindable(host, port + k) for k in range(span)):
            return port
    raise OSError(f"no free port below the ephemeral range ({low}) after {attempts} tries")


def wait_for_port(host: str, port: int, timeout: float = 15.0) -> None:
    """Block until something accepts TCP connections on host:port, or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout:.0f}s")
