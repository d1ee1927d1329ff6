"""Shards served by sendfile(2) (workloads/broadcast/sendfile.py): exactly the bytes asked for, whole
or by Range, the same bytes on the fallback path of a server without the extension, and a byte
corrupted on disk still caught by the client's blake3 (sendfile sends what is on disk, unchecked)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import httpx
import pytest
from fastapi import FastAPI, Request

from tests.broadcast.helpers import SHARD, BroadcastServer, random_file, sha256, start_origin, start_relay
from tests.support.testing import ServerThread
from workloads.broadcast.client import download
from workloads.broadcast.errors import ShardCorrupt
from workloads.broadcast.origin import publish
from workloads.broadcast.sendfile import SendfileCycle, ShardFile, byte_range

SIZE = 3 * SHARD + 123


@pytest.fixture
def sendfile_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(offset, count) of every body the servers of this process sent through SendfileCycle."""
    calls: list[tuple[int, int]] = []
    real = SendfileCycle._sendfile

    async def spy(self: SendfileCycle, file: BinaryIO, offset: int, count: int) -> int:
        calls.append((offset, count))
        return await real(self, file, offset, count)

    monkeypatch.setattr(SendfileCycle, "_sendfile", spy)
    return calls


def _file_app(path: Path) -> FastAPI:
    app = FastAPI()

    @app.api_route("/f", methods=["GET", "HEAD"])
    def serve(request: Request) -> ShardFile:
        return ShardFile(path, request.headers.get("range"))

    return app


@pytest.mark.parametrize("zero_copy", [True, False], ids=["sendfile", "fallback"])
def test_ranges_serve_exactly_the_bytes_asked_for(tmp_path, servers, zero_copy, sendfile_calls):
    path = random_file(tmp_path / "shard", SIZE)
    data = path.read_bytes()
    server = (BroadcastServer if zero_copy else ServerThread)(_file_app(path)).start()
    servers.append(server)
    url = f"{server.url}/f"
    with httpx.Client(timeout=10) as http:
        whole = http.get(url)
        assert (whole.status_code, whole.content) == (200, data)
        assert whole.headers["accept-ranges"] == "bytes"
        cases = {"bytes=10-99": data[10:100], f"bytes={SIZE - 5}-": data[-5:], "bytes=-7": data[-7:],
                 f"bytes=100-{SIZE + 50}": data[100:], "bytes=0-0": data[:1]}  # fmt: skip
        for header, expected in cases.items():
            part = http.get(url, headers={"Range": header})
            assert part.status_code == 206, header
            assert part.content == expected, header
            start = SIZE - len(expected) if header.startswith("bytes=-") else int(header[6:].split("-")[0])
            assert part.headers["content-range"] == f"bytes {start}-{start + len(expected) - 1}/{SIZE}"
        for header in (f"bytes={SIZE}-", "bytes=-0", f"bytes=50-{10}"):
            refused = http.get(url, headers={"Range": header})
            assert refused.status_code == 416, header
            assert refused.headers["content-range"] == f"bytes */{SIZE}"
        several = http.get(url, headers={"Range": "bytes=0-1,5-6"})  # several ranges: the whole file
        assert (several.status_code, several.content) == (200, data)
        head = http.head(url, headers={"Range": "bytes=10-19"})
        assert (head.status_code, head.headers["content-length"], head.content) == (206, "10", b"")
    if zero_copy:  # every body above went by sendfile, at the offset and length of its range
        assert (0, SIZE) in sendfile_calls and (10, 90) in sendfile_calls and (SIZE - 7, 7) in sendfile_calls
        assert len(sendfile_calls) == 7
    else:
        assert sendfile_calls == []


def test_byte_range_parsing():
    assert byte_range(None, 10) is None
    assert byte_range("bytes=0-1,3-4", 10) is None
    assert byte_range("items=0-1", 10) is None
    assert byte_range("bytes=2-", 10) == (2, 10)
    assert byte_range("bytes=-3", 10) == (7, 10)
    assert byte_range("bytes=-30", 10) == (0, 10)
    assert byte_range("bytes=4-400", 10) == (4, 10)
    for bad in ("bytes=10-", "bytes=-0", "bytes=5-4"):
        with pytest.raises(ValueError):
            byte_range(bad, 10)


def test_a_byte_corrupted_on_disk_goes_out_by_sendfile_and_is_caught(tmp_path, servers, sendfile_calls):
    root = tmp_path / "origin"
    origin = start_origin(root)
    servers.append(origin)
    src = random_file(tmp_path / "ckpt", 5 * SHARD)
    publish(origin.server.config.app.state.store, src, 1, SHARD)
    download(1, tmp_path / "ok", [origin.url])
    assert sha256(tmp_path / "ok") == sha256(src)
    assert len(sendfile_calls) == 5
    shard = root / "v1" / "shard_00002.bin"
    with open(shard, "r+b") as f:  # one bit, in place: the origin's sendfile sends it as it is
        f.seek(SHARD // 2)
        byte = f.read(1)[0]
        f.seek(SHARD // 2)
        f.write(bytes([byte ^ 0x01]))
    with pytest.raises(ShardCorrupt, match="shard 2 failed its blake3 check"):
        download(1, tmp_path / "bad", [origin.url])
    assert not (tmp_path / "bad").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


def test_a_relay_serves_by_sendfile_while_it_fetches_and_a_resume_continues_the_hash(
    tmp_path, servers, sendfile_calls
):
    origin = start_origin(tmp_path / "origin")
    servers.append(origin)
    relay = start_relay(origin.url, tmp_path / "relay")
    servers.append(relay)
    src = random_file(tmp_path / "ckpt", 6 * SHARD + 17)
    publish(origin.server.config.app.state.store, src, 1, SHARD)
    result = download(1, tmp_path / "out", [relay.url], wait_seconds=20)
    assert sha256(tmp_path / "out") == sha256(src) == result.digest
    # The origin sent 7 shards to the relay, the relay 7 to the client: all by sendfile.
    assert len(sendfile_calls) == 14
    # A client resuming a shard asks for the rest by Range: exactly the bytes after the cut.
    body = httpx.get(f"{relay.url}/v1/shard_00007.bin", headers={"Range": "bytes=5-"}, timeout=10).content
    assert body == src.read_bytes()[6 * SHARD + 5 :]
    assert os.path.getsize(tmp_path / "relay" / "v1" / "shard_00007.bin") == 17
