"""Connections that never finish their request head are closed (issue 19.8): before, a connection that
sent nothing, or its headers a byte at a time, stayed open forever."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI

from intellect.http_server import HeaderTimeoutProtocol
from tests.support.testing import ServerThread


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ServerThread]:
    monkeypatch.setattr(HeaderTimeoutProtocol, "header_timeout", 1.0)
    app = FastAPI()

    @app.get("/slow")
    async def slow() -> dict[str, bool]:
        import asyncio

        await asyncio.sleep(2.0)  # longer than the header deadline: a slow answer is not cut
        return {"ok": True}

    @app.post("/echo")
    async def echo(body: dict) -> dict:
        return body

    with ServerThread(app) as running:
        yield running


def closed_after(sock: socket.socket, limit: float) -> float | None:
    """Seconds until the server closed `sock` (recv gives b""), or None if still open after `limit`."""
    started = time.monotonic()
    sock.settimeout(limit)
    try:
        while sock.recv(1024):
            pass
    except TimeoutError:
        return None
    return time.monotonic() - started


def test_a_silent_connection_is_closed(server: ServerThread) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        waited = closed_after(sock, 5.0)
    assert waited is not None and waited < 3.0


def test_headers_trickled_a_byte_at_a_time_are_cut_off(server: ServerThread) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        started = time.monotonic()
        closed = False
        for byte in b"GET /slow HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 100:
            try:
                sock.send(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.05)
        if not closed:
            closed = closed_after(sock, 1.0) is not None
    assert closed and time.monotonic() - started < 5.0


def test_requests_slow_answers_and_kept_alive_connections_still_work(server: ServerThread) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert client.get("/slow").json() == {"ok": True}  # 2 s > the 1 s head deadline
        time.sleep(0.5)
        assert client.post("/echo", json={"a": 1}).json() == {"a": 1}  # same connection, next request
        time.sleep(1.5)  # idle past the head deadline between requests: uvicorn's keep-alive rules
        assert client.post("/echo", json={"b": 2}).json() == {"b": 2}
