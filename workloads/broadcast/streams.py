"""Shard bodies read with the standard library's http.client straight into a reusable 1 MiB buffer.

Why not httpx here (it still fetches manifests and version lists): a shard body is hundreds of MB,
and httpx hands it over in 64 KiB `bytes` chunks, each through its HTTP parser. On this 2-core
machine that capped one stream at about 480 MB/s on loopback, where `readinto` a preallocated
buffer reached 850-1,090 MB/s (both with blake3 on the way; bench/broadcast.py measures the client).
One keep-alive connection per (thread, relay); a connection whose state is unknown after an error
is dropped and reopened on the next request.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

READ_BUFFER = 1 << 20


class StreamError(Exception):
    """A shard request failed on the HTTP side (status, short body, protocol): try another relay."""


class ShardStreams:
    """Per-thread keep-alive connections to relays, and the buffer each thread reads into."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[http.client.HTTPConnection] = []

    def _connections(self) -> dict[str, http.client.HTTPConnection]:
        conns: dict[str, http.client.HTTPConnection] | None = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        return conns

    def buffer(self) -> memoryview:
        """This thread's read buffer (allocated once per thread)."""
        view: memoryview | None = getattr(self._local, "view", None)
        if view is None:
            view = self._local.view = memoryview(bytearray(READ_BUFFER))
        return view

    def _connection(self, relay: str) -> http.client.HTTPConnection:
        conns = self._connections()
        conn = conns.get(relay)
        if conn is None:
            url = urlsplit(relay)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise StreamError(f"{relay}: not an http(s) URL")
            kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
            conn = kind(url.hostname, url.port, timeout=self.timeout)
            conns[relay] = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def drop(self, relay: str) -> None:
        conn = self._connections().pop(relay, None)
        if conn is not None:
            conn.close()

    @contextmanager
    def get(self, relay: str, path: str, start: int = 0) -> Iterator[http.client.HTTPResponse]:
        """GET `relay`/`path` (from byte `start` with Range); yields the response, status 200 or 206.
        Any other status, or any error while the caller reads, drops the connection."""
        prefix = urlsplit(relay).path.rstrip("/")
        headers = {"Range": f"bytes={start}-"} if start else {}
        try:
            conn = self._connection(relay)
            conn.request("GET", f"{prefix}/{path}", headers=headers)
            resp = conn.getresponse()
            if resp.status not in (200, 206):
                raise StreamError(f"HTTP {resp.status}")
            yield resp
            if not resp.isclosed():  # the caller stopped early: the rest of the body is unread
                self.drop(relay)
        except BaseException:
            self.drop(relay)
            raise

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
