"""Small networking helpers shared by services and tests."""

from __future__ import annotations

import socket
import time


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free right now on `host`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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
