from __future__ import annotations

import threading

import pytest
import uvicorn

from intellect.net import free_port, wait_for_port
from intellect.redis_server import EmbeddedRedis


class ServerThread:
    """A real uvicorn server on a free loopback port, in a thread of the test process."""

    def __init__(self, app) -> None:  # type: ignore[no-untyped-def]
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        wait_for_port("127.0.0.1", self.port)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def redis_server():
    with EmbeddedRedis() as redis:
        yield redis
