"""Helpers of the broadcast tests: random checkpoint files, a published origin, relays in threads or
in subprocesses (those a test kills), and polling. Every server runs on a free loopback port and is
stopped by the fixture that started it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI

from intellect.net import free_port
from tests.support.testing import ServerThread
from workloads.broadcast.origin import create_origin_app, publish
from workloads.broadcast.relay import create_relay_app
from workloads.broadcast.sendfile import server_options
from workloads.broadcast.store import VersionStore

REPO = Path(__file__).resolve().parents[2]
SHARD = 64 * 1024


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def random_file(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    return path


def wait_until(check: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met after {timeout}s")
        time.sleep(0.05)


def complete_on(url: str, version: int) -> bool:
    try:
        return version in httpx.get(f"{url}/health", timeout=2).json()["complete"]
    except httpx.HTTPError:
        return False


class BroadcastServer(ServerThread):
    """A ServerThread with the uvicorn options the broadcast CLI runs origins and relays with: shard
    bodies go out by sendfile (workloads/broadcast/sendfile.py), as in production."""

    def __init__(self, app: FastAPI) -> None:
        super().__init__(app)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=10, **server_options())  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name=f"uvicorn-{self.port}")


def start_origin(root: Path, keep: int = 5) -> ServerThread:
    app = create_origin_app(VersionStore(root, keep=keep), shard_size=SHARD, poll_seconds=0.2)
    return BroadcastServer(app).start()


def start_relay(upstream: str, root: Path, keep: int = 5, shard_wait: float = 5.0) -> ServerThread:
    app = create_relay_app(upstream, VersionStore(root, keep=keep), poll_seconds=0.1, shard_wait=shard_wait)
    return BroadcastServer(app).start()


def published_origin(tmp_path: Path, servers: list[ServerThread | RelayProcess], size: int,
                     version: int) -> tuple[ServerThread, Path]:  # fmt: skip
    """An origin in `tmp_path / "origin"` (stopped with the test's `servers`) that holds a random file
    of `size` bytes, `tmp_path / "ckpt"`, published as `version`; the origin and the file."""
    origin = start_origin(tmp_path / "origin")
    servers.append(origin)
    src = random_file(tmp_path / "ckpt", size)
    publish(origin.server.config.app.state.store, src, version, SHARD)
    return origin, src


def origin_and_relay(
    tmp_path: Path, servers: list[ServerThread | RelayProcess]
) -> tuple[ServerThread, ServerThread]:
    """An origin in `tmp_path / "origin"` and a relay of it in `tmp_path / "relay"`, holding nothing yet
    (stopped with the test's `servers`)."""
    origin = start_origin(tmp_path / "origin")
    servers.append(origin)
    relay = start_relay(origin.url, tmp_path / "relay")
    servers.append(relay)
    return origin, relay


class RelayProcess:
    """A relay run by the real CLI in its own process, so a test can SIGKILL it mid-transfer."""

    def __init__(self, upstream: str, root: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "INTELLECT_BROADCAST_POLL_SECONDS": "0.1", "PYTHONPATH": str(REPO)}
        code = "from workloads.broadcast.cli import main; main()"
        args = ["relay", "--upstream", upstream, "--dir", str(root), "--port", str(self.port)]
        args += ["--host", "127.0.0.1"]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, "--log-level", "warning", *args], cwd=REPO, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
