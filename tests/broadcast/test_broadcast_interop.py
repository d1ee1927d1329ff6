"""Range resume against a server that cuts every first response short, a checkpoint watcher, and
shardcast 0.3.2 interop both ways, against the real installed package (its client shells out to wget)."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, Response, StreamingResponse

from intellect.net import free_port
from tests.broadcast.helpers import SHARD, random_file, sha256, start_origin, start_relay, wait_until
from tests.support.testing import ServerThread
from workloads.broadcast.client import download
from workloads.broadcast.origin import CheckpointWatcher, publish
from workloads.broadcast.shardcast_compat import download_shardcast, parse_distribution
from workloads.broadcast.store import VersionStore

MB = 1_000_000


def _cutting_app(store: VersionStore, seen_ranges: list[str]) -> FastAPI:
    """Serves `store`, but the first request of each shard stops at half the shard (the connection
    closes with bytes missing); later requests, Range or not, are served in full."""
    app = FastAPI()
    cut: set[str] = set()
    lock = threading.Lock()

    @app.get("/v{version}/manifest.json")
    def manifest(version: int) -> Response:
        return Response(store.manifest(version).model_dump_json(), media_type="application/json")

    @app.get("/v{version}/{name}")
    def shard(version: int, name: str, request: Request) -> Response:
        path = store.version_dir(version) / name
        if request.headers.get("range"):
            seen_ranges.append(request.headers["range"])
        with lock:
            first = name not in cut
            cut.add(name)
        if not first:
            return FileResponse(path)
        data = path.read_bytes()

        async def half() -> AsyncIterator[bytes]:
            yield data[: len(data) // 2]

        return StreamingResponse(half(), headers={"content-length": str(len(data))})

    return app


def test_partial_shard_resumes_with_range(tmp_path, servers):
    store = VersionStore(tmp_path / "store")
    src = random_file(tmp_path / "ckpt", 3 * SHARD + 1234)  # 4 shards (each cut costs a retry pause)
    manifest = publish(store, src, 1, SHARD)
    seen: list[str] = []
    flaky = ServerThread(_cutting_app(store, seen)).start()
    servers.append(flaky)
    result = download(1, tmp_path / "out", [flaky.url])
    assert sha256(tmp_path / "out") == sha256(src)
    assert len(manifest.shards) == 4
    assert result.resumed_requests == 4  # every shard: half, then the rest by Range
    assert f"bytes={SHARD // 2}-" in seen


def test_watcher_publishes_a_step_only_once_its_json_exists(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    store = VersionStore(tmp_path / "store")
    watcher = CheckpointWatcher(store, ckpt, SHARD)
    weights = random_file(ckpt / "step_1.safetensors", 200_000)
    (ckpt / "step_1.safetensors.sha256").write_text(f"{sha256(weights)}  step_1.safetensors\n")
    assert watcher.scan_once() == []  # the trainer writes the json last: not complete yet
    (ckpt / "step_1.json").write_text(json.dumps({"step": 1, "sha256": sha256(weights)}))
    assert watcher.scan_once() == [1] and store.is_complete(1)
    random_file(ckpt / "step_2.safetensors", 1000)
    (ckpt / "step_2.json").write_text(json.dumps({"step": 2, "sha256": "0" * 64}))  # does not match
    assert watcher.scan_once() == [] and store.versions() == [1]


@pytest.fixture(scope="module")
def wget() -> str:
    path = shutil.which("wget")
    if path is None:
        pytest.skip("wget is not installed: shardcast 0.3.2's client shells out to it")
    return path


def test_shardcast_client_downloads_from_our_origin_and_relay(tmp_path, servers, wget):
    from shardcast.client_node import ClientNode

    origin = start_origin(tmp_path / "origin")
    servers.append(origin)
    src = random_file(tmp_path / "ckpt", 1 * MB + 5)
    manifest = publish(origin.server.config.app.state.store, src, 2, SHARD)
    relay = start_relay(origin.url, tmp_path / "relay")
    servers.append(relay)
    wait_until(lambda: "v2:" in httpx.get(f"{relay.url}/distribution.txt").text, 30, "relay announces v2")
    expected = f"v2: {manifest.blake3}|{len(manifest.shards)}\n"
    assert httpx.get(f"{relay.url}/distribution.txt").text == expected
    for server in (origin, relay):
        out = tmp_path / f"from-{server.port}.bin"
        node = ClientNode([server.url], str(tmp_path / f"dl-{server.port}"))
        assert node.download_version("v2", str(out)) == str(out)
        assert sha256(out) == sha256(src)


@pytest.fixture
def shardcast_origin(tmp_path: Path):
    from shardcast.origin_server import OriginServer

    port = free_port()
    node = OriginServer(str(tmp_path / "sc-origin"), port)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _answers(url), 10, "shardcast origin up")
    yield node, url
    node.shutdown()
    _answers(url)  # its serve loop checks the stop flag only between requests


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/distribution.txt", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_our_client_downloads_from_a_real_shardcast_origin(tmp_path, shardcast_origin):
    node, url = shardcast_origin
    src = random_file(tmp_path / "ckpt", 1 * MB + 77)
    node.broadcast(str(src), shard_size=SHARD)  # shardcast numbers versions itself: v1
    first = random_file(tmp_path / "ckpt2", 300_000)
    node.broadcast(str(first), shard_size=100_000)
    listed = parse_distribution(httpx.get(f"{url}/distribution.txt").text)
    assert listed[1][1] == 16 and listed[2][1] == 3
    result = download_shardcast(1, tmp_path / "out1", [url])
    assert sha256(tmp_path / "out1") == sha256(src) and result.digest == listed[1][0]
    download_shardcast(2, tmp_path / "out2", [url], concurrency=2)
    assert sha256(tmp_path / "out2") == sha256(first)
