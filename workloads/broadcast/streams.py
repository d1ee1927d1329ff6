"""Shard bodies read with the standard library's http.client straight into reusable 1 MiB buffers,
written to the file behind the reads (WriteBehind); small requests (manifests, shardcast's
distribution.txt and HEADs) on the same connections.

Why not httpx (neither client nor relay uses it any more): a shard body is
hundreds of MB, and httpx hands it over in 64 KiB `bytes` chunks, each through its HTTP parser. On
this 2-core machine that capped one stream at about 480 MB/s on loopback, where `readinto` a
preallocated buffer reached 850-1,090 MB/s (both with blake3 on the way; bench/broadcast.py
measures the client). And building an httpx client (its TLS context) cost 0.1-0.15 s per download.
One keep-alive connection per (thread, relay); a connection whose state is unknown after an error
is dropped and reopened on the next request.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import os
import queue
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

READ_BUFFER = 1 << 20


class StreamError(Exception):
    """A shard request failed on the HTTP side (status, short body, protocol): try another relay."""


def preallocate(fd: int, size: int) -> None:
    """Give the file its final size with its blocks allocated (posix_fallocate): writes into allocated
    blocks cost ~30% less CPU here than into the holes of a truncated file (ext4 allocates those page
    by page), and a full disk fails now rather than mid-download. Falls back to ftruncate where the
    filesystem cannot preallocate."""
    if size <= 0:
        os.ftruncate(fd, 0)
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        os.ftruncate(fd, size)


class WriteFailed(OSError):
    """A queued write did not reach the file: bytes after the last flushed point are unknown."""


class ShardStreams:
    """Per-thread keep-alive connections to relays, and the buffer each thread reads into."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[http.client.HTTPConnection] = []
        self._closed = False  # after close(): no new connection (a woken long-poll must not retry)

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
        if self._closed:
            raise StreamError("connections closed: stopping")
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
            resp = self._request(relay, f"{prefix}/{path}", headers)
            if resp.status not in (200, 206):
                raise StreamError(f"HTTP {resp.status}")
            yield resp
            if not resp.isclosed():  # the caller stopped early: the rest of the body is unread
                self.drop(relay)
        except BaseException:
            self.drop(relay)
            raise

    def _request(self, relay: str, target: str, headers: dict[str, str]) -> http.client.HTTPResponse:
        """GET on this thread's connection to `relay`. A kept-alive connection the server closed while
        it idled (uvicorn closes one after 5 s: between two versions, a relay's fetch threads find
        theirs closed) fails before any response: it is reopened once, at once, rather than the shard
        failing and waiting for the next round."""
        for attempt in range(2):
            conn = self._connection(relay)
            reused = conn.sock is not None
            try:
                conn.request("GET", target, headers=headers)
                return conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.drop(relay)
                if not (reused and attempt == 0):
                    raise
        raise AssertionError("unreachable")

    def fetch(
        self, relay: str, path: str, *, method: str = "GET", limit: int = 64 << 20
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        """A small request (manifest, version list, HEAD) on this thread's keep-alive connection:
        (status, headers, body), whatever the status. A body over `limit` bytes raises StreamError.
        A kept-alive connection the server closed meanwhile is reopened once."""
        prefix = urlsplit(relay).path.rstrip("/")
        for attempt in range(2):
            conn = self._connection(relay)
            reused = conn.sock is not None
            try:
                conn.request(method, f"{prefix}/{path}")
                resp = conn.getresponse()
                body = resp.read(limit + 1)  # b"" for HEAD (and that closes the response)
                if len(body) > limit:
                    raise StreamError(f"{path}: more than {limit} bytes")
                if not resp.isclosed():
                    self.drop(relay)
                return resp.status, resp.headers, body
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.drop(relay)
                if reused and attempt == 0:
                    continue
                raise
            except BaseException:
                self.drop(relay)
                raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close every thread's connections. A socket is shut down first: that wakes a thread blocked
        reading it (a long-poll, a held shard request), where a bare close would leave it waiting."""
        with self._lock:
            self._closed = True
            for conn in self._all:
                if conn.sock is not None:
                    with contextlib.suppress(OSError):
                        conn.sock.shutdown(socket.SHUT_RDWR)
                conn.close()
            self._all.clear()


class WriteBehind:
    """Positioned writes (`os.pwrite`) done by a helper thread, so the thread reading a stream can
    receive and hash the next buffer while the previous one is copied into the file (recv, blake3 and
    pwrite all release the GIL: on 2 cores the three no longer add up in one thread).

    `depth` buffers of `size` bytes cycle between the reader and the writer, so memory stays at
    depth × size whatever the file size. `buffer()` hands out a free buffer (waiting while all are
    queued), `write()` queues one, `flush()` waits until everything queued is in the file and raises
    the first write error since the last flush (later writes are skipped: the caller must rewrite
    from a point it knows was written). `close()` ends the thread once the queue is drained."""

    def __init__(self, size: int = READ_BUFFER, depth: int = 3) -> None:
        self._free: queue.SimpleQueue[memoryview] = queue.SimpleQueue()
        for _ in range(max(1, depth)):
            self._free.put(memoryview(bytearray(size)))
        self._todo: queue.Queue[tuple[int, memoryview, int, int] | None] = queue.Queue()
        self._error: WriteFailed | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="broadcast-write")
        self._thread.start()

    def buffer(self) -> memoryview:
        """A buffer to read into; give it back with write() (or release())."""
        return self._free.get()

    def release(self, view: memoryview) -> None:
        """Return a buffer that holds nothing to write."""
        self._free.put(view)

    def chunks(
        self, resp: http.client.HTTPResponse, room: int, too_much: str
    ) -> Iterator[tuple[memoryview, int]]:
        """The body of `resp`, chunk by chunk in free buffers, as (buffer, bytes read). More than
        `room` bytes in all raises StreamError(`too_much`). The caller gives each buffer back with
        write() or release(); a buffer not yet yielded is given back here."""
        while True:
            view = self.buffer()
            try:
                n = resp.readinto(view)
                if n > room:
                    raise StreamError(too_much)
            except BaseException:
                self.release(view)
                raise
            if not n:
                self.release(view)
                return
            room -= n
            yield view, n

    def write(self, fd: int, view: memoryview, nbytes: int, offset: int) -> None:
        """Queue `view[:nbytes]` for file `fd` at `offset`; `view` comes back to buffer() once written.
        `fd` must stay open until the next drain()/flush()."""
        self._todo.put((fd, view, nbytes, offset))

    def drain(self) -> WriteFailed | None:
        """Wait until every queued write is done; return (and forget) the first write error since the
        last drain, if any."""
        self._todo.join()
        error, self._error = self._error, None
        return error

    def flush(self) -> None:
        """drain(), raising its error."""
        if (error := self.drain()) is not None:
            raise error

    def close(self) -> None:
        """Drain the queue and stop the thread (idempotent). Errors not flushed are dropped."""
        if self._thread.is_alive():
            self._todo.put(None)
            self._thread.join()

    def _run(self) -> None:
        while (item := self._todo.get()) is not None:
            fd, view, nbytes, offset = item
            try:
                if self._error is None:
                    done = 0
                    while done < nbytes:  # pwrite may write less than asked
                        wrote = os.pwrite(fd, view[done:nbytes], offset + done)
                        if wrote <= 0:
                            raise OSError(f"pwrite wrote nothing at byte {offset + done}")
                        done += wrote
            except OSError as exc:
                self._error = WriteFailed(f"writing {nbytes} bytes at {offset}: {exc}")
            finally:
                self._free.put(view)
                self._todo.task_done()
        self._todo.task_done()


class WriterPool:
    """One WriteBehind per thread that asks (created on its first use), all closed together: the
    client's download threads of one run, a relay's fetch threads."""

    def __init__(self, size: int = READ_BUFFER, depth: int = 3) -> None:
        self.size, self.depth = size, depth
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[WriteBehind] = []

    def get(self) -> WriteBehind:
        writer: WriteBehind | None = getattr(self._local, "writer", None)
        if writer is None:
            writer = self._local.writer = WriteBehind(self.size, self.depth)
            with self._lock:
                self._all.append(writer)
        return writer

    def close(self) -> None:
        with self._lock:
            for writer in self._all:
                writer.close()
            self._all.clear()
