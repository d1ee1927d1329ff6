"""The transfer plumbing under the client and the relay: write-behind buffers (writes land where
asked, a failed write is reported and the shard rewritten, memory stays at depth × size), and small
and shard requests on kept-alive connections (a connection the server dropped is reopened once)."""

from __future__ import annotations

import errno
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import workloads.broadcast.streams as streams
from tests.broadcast.helpers import SHARD, published_origin, sha256
from tests.support.loopback import accept_each
from workloads.broadcast.client import download
from workloads.broadcast.errors import BroadcastError
from workloads.broadcast.streams import ShardStreams, WriteBehind, WriteFailed

MB = 1_000_000


def test_write_behind_writes_every_buffer_at_its_offset(tmp_path: Path) -> None:
    data = os.urandom(10 * 4096 + 123)
    fd = os.open(tmp_path / "out", os.O_RDWR | os.O_CREAT)
    writer = WriteBehind(size=4096, depth=2)
    try:
        # Written back to front: only the offsets decide where bytes go.
        offsets = list(range(0, len(data), 4096))[::-1]
        for offset in offsets:
            view = writer.buffer()
            chunk = data[offset : offset + 4096]
            view[: len(chunk)] = chunk
            writer.write(fd, view, len(chunk), offset)
        writer.flush()
    finally:
        writer.close()
        os.close(fd)
    assert (tmp_path / "out").read_bytes() == data


def test_write_behind_hands_out_at_most_depth_buffers(tmp_path: Path) -> None:
    writer = WriteBehind(size=16, depth=2)
    try:
        first, second = writer.buffer(), writer.buffer()
        got: list[memoryview] = []
        waiter = threading.Thread(target=lambda: got.append(writer.buffer()), daemon=True)
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive() and not got  # both buffers are out: the reader waits
        writer.release(first)
        waiter.join(5)
        assert got and got[0] is first
        writer.release(second)
        writer.release(got[0])
    finally:
        writer.close()


def test_write_behind_reports_a_failed_write_once(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "ro", os.O_RDONLY | os.O_CREAT)  # pwrite on it fails (EBADF)
    writer = WriteBehind(size=8, depth=2)
    try:
        view = writer.buffer()
        writer.write(fd, view, 8, 0)
        with pytest.raises(WriteFailed):
            writer.flush()
        writer.flush()  # reported once: the caller has rewritten what it must
    finally:
        writer.close()
        os.close(fd)


def test_a_failed_write_restarts_the_shard_and_the_file_is_still_right(tmp_path, servers, monkeypatch):
    origin, src = published_origin(tmp_path, servers, MB, 1)
    real_pwrite = os.pwrite
    failures = {"left": 3}
    lock = threading.Lock()

    def flaky_pwrite(fd: int, data: memoryview, offset: int) -> int:
        with lock:
            fail = offset >= SHARD and failures["left"] > 0  # mid-file, after some bytes were written
            failures["left"] -= fail
        if fail:
            raise OSError(28, "No space left on device (injected)")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(streams.os, "pwrite", flaky_pwrite)
    result = download(1, tmp_path / "out", [origin.url], concurrency=2)
    assert failures["left"] == 0
    assert sha256(tmp_path / "out") == sha256(src) == result.digest
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


class _OneShotServer:
    """HTTP/1.1 server that answers every request with keep-alive headers, then closes the socket
    anyway: a kept-alive connection the server dropped, as after its idle timeout."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.thread = threading.Thread(target=accept_each, args=(self.sock, self._answer), daemon=True)
        self.thread.start()

    def _answer(self, conn: socket.socket) -> None:
        self.connections += 1
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                request += chunk
            body = b"hello"
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\n" + body)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def one_shot() -> Iterator[_OneShotServer]:
    server = _OneShotServer()
    yield server
    server.close()


def test_small_requests_reopen_a_connection_the_server_dropped(one_shot: _OneShotServer) -> None:
    conns = ShardStreams(timeout=5)
    try:
        for _ in range(3):
            status, headers, body = conns.fetch(one_shot.url, "v1/manifest.json")
            assert (status, body, headers["content-length"]) == (200, b"hello", "5")
        assert one_shot.connections == 3  # each later request found its connection closed, reopened
    finally:
        conns.close()


def test_shard_requests_reopen_a_connection_the_server_dropped(one_shot: _OneShotServer) -> None:
    """A relay's fetch threads find their connections closed by the upstream after an idle spell (a
    new version minutes later): the shard request reopens once at once instead of failing the shard."""
    conns = ShardStreams(timeout=5)
    try:
        for _ in range(3):
            with conns.get(one_shot.url, "v1/shard_00001.bin") as resp:
                assert (resp.status, resp.read()) == (200, b"hello")
        assert one_shot.connections == 3
    finally:
        conns.close()


def test_small_requests_refuse_oversized_bodies(one_shot: _OneShotServer) -> None:
    conns = ShardStreams(timeout=5)
    try:
        with pytest.raises(streams.StreamError, match="more than 3 bytes"):
            conns.fetch(one_shot.url, "big", limit=3)
    finally:
        conns.close()


def test_preallocate_gives_the_final_size_and_falls_back_to_truncate(tmp_path: Path, monkeypatch) -> None:
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        streams.preallocate(fd, 12345)
        assert os.fstat(fd).st_size == 12345

        def unsupported(fd: int, offset: int, length: int) -> None:
            raise OSError(errno.EOPNOTSUPP, "not here")

        monkeypatch.setattr(streams.os, "posix_fallocate", unsupported)
        streams.preallocate(fd, 777)
        assert os.fstat(fd).st_size == 777
    finally:
        os.close(fd)


def test_a_disk_too_small_fails_the_download_up_front(tmp_path, servers, monkeypatch) -> None:
    origin, _ = published_origin(tmp_path, servers, MB // 2, 1)

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(streams.os, "posix_fallocate", full)
    with pytest.raises(BroadcastError, match="cannot allocate"):
        download(1, tmp_path / "out", [origin.url])
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]
