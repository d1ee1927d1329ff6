"""End to end over real uvicorn servers: publish → origin → relay(s) → client, and what goes wrong on
the way (a relay dying mid-transfer, corrupt shards, a restart, many clients, pruning)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.broadcast.helpers import (
    REPO,
    SHARD,
    RelayProcess,
    complete_on,
    origin_and_relay,
    published_origin,
    random_file,
    sha256,
    start_origin,
    start_relay,
    wait_until,
)
from workloads.broadcast.client import download
from workloads.broadcast.errors import ManifestMismatch, ShardCorrupt, VersionNotFound
from workloads.broadcast.manifest import VersionManifest
from workloads.broadcast.origin import publish
from workloads.broadcast.store import VersionStore
from workloads.inference.checkpoints import CheckpointError, CheckpointStore

MB = 1_000_000


def test_publish_origin_relay_client_pipelined(tmp_path, servers):
    origin, relay = origin_and_relay(tmp_path, servers)
    src = random_file(tmp_path / "step_1.safetensors", 3 * MB + 123)
    store: VersionStore = origin.server.config.app.state.store
    manifest = publish(store, src, 1, SHARD)
    # The client starts right away: the relay lists v1 as soon as it has the manifest and holds shard
    # requests until each shard is verified, so this transfer overlaps the relay's own.
    result = download(1, tmp_path / "out.bin", [relay.url], wait_seconds=20)
    assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()
    assert result.digest == manifest.sha256 == sha256(src)
    assert not list(tmp_path.glob(".out.bin.*"))  # no temp left
    listed = httpx.get(f"{relay.url}/versions").json()["versions"]
    assert [v["version"] for v in listed] == [1]
    assert VersionManifest.model_validate(listed[0]["manifest"]) == manifest
    metrics = httpx.get(f"{relay.url}/metrics").text
    assert "broadcast_shards_served_total" in metrics and "broadcast_versions_held 1.0" in metrics
    with pytest.raises(VersionNotFound, match="no relay holds version 2"):
        download(2, tmp_path / "none.bin", [relay.url, origin.url])
    with pytest.raises(ManifestMismatch):
        download(1, tmp_path / "other.bin", [relay.url], expected_sha256="0" * 64)
    assert not (tmp_path / "other.bin").exists()


def test_relay_killed_mid_transfer_client_finishes_from_the_other(tmp_path, servers):
    origin, src = published_origin(tmp_path, servers, 4 * MB, 3)
    doomed, spare = RelayProcess(origin.url, tmp_path / "r1"), RelayProcess(origin.url, tmp_path / "r2")
    servers.extend([doomed, spare])
    wait_until(lambda: complete_on(doomed.url, 3) and complete_on(spare.url, 3), 60, "relays mirrored v3")
    killed = threading.Event()

    def kill_on_first_bytes(relay: str, index: int, received: int) -> None:
        if relay == doomed.url and not killed.is_set():
            killed.set()
            doomed.kill()  # this transfer, and any other on that relay, is cut right here

    result = download(3, tmp_path / "out", [doomed.url, spare.url], progress=kill_on_first_bytes)
    assert killed.is_set()
    assert sha256(tmp_path / "out") == sha256(src) == result.digest
    assert result.bytes_by_relay[spare.url] > 0


def _corrupt_all_shards(root: Path, version: int) -> None:
    for shard in sorted((root / f"v{version}").glob("shard_*.bin")):
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))


def test_corrupt_shards_are_rejected_and_fetched_elsewhere(tmp_path, servers):
    origin, src = published_origin(tmp_path, servers, 3 * MB, 1)
    bad, good = start_relay(origin.url, tmp_path / "bad"), start_relay(origin.url, tmp_path / "good")
    servers.extend([bad, good])
    wait_until(lambda: complete_on(bad.url, 1) and complete_on(good.url, 1), 30, "relays mirrored v1")
    _corrupt_all_shards(tmp_path / "bad", 1)  # bit rot on disk, after the relay verified them

    result = download(1, tmp_path / "out", [bad.url, good.url])
    assert sha256(tmp_path / "out") == sha256(src)
    assert result.rejected_shards >= 1  # 46 shards: the bad relay is picked for some of them

    with pytest.raises(ShardCorrupt, match="failed its blake3 check from every relay.*version dropped"):
        download(1, tmp_path / "only-bad", [bad.url])
    assert not (tmp_path / "only-bad").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


def test_relay_never_serves_a_shard_that_fails_its_sha256(tmp_path, servers):
    origin, src = published_origin(tmp_path, servers, 1 * MB, 1)
    shard = tmp_path / "origin" / "v1" / "shard_00002.bin"
    good_bytes = shard.read_bytes()
    shard.write_bytes(b"\0" * len(good_bytes))  # the origin's copy rots
    relay = start_relay(origin.url, tmp_path / "relay", shard_wait=0.2)
    servers.append(relay)
    wait_until(lambda: len(list((tmp_path / "relay" / "v1").glob("shard_*.bin"))) == 15, 30, "other shards")
    assert httpx.get(f"{relay.url}/v1/shard_00002.bin").status_code == 503
    assert "v1" not in httpx.get(f"{relay.url}/distribution.txt").text  # incomplete: not announced
    shard.write_bytes(good_bytes)  # repaired upstream: the relay's next round gets it
    wait_until(lambda: complete_on(relay.url, 1), 30, "relay refetched the shard")
    assert httpx.get(f"{relay.url}/v1/shard_00002.bin").content == good_bytes
    assert "broadcast_shards_rejected_total" in httpx.get(f"{relay.url}/metrics").text


def test_origin_restart_keeps_versions_and_discards_half_written(tmp_path, servers):
    root = tmp_path / "origin"
    origin = start_origin(root)
    src = random_file(tmp_path / "ckpt", 2 * MB)
    publish(origin.server.config.app.state.store, src, 7, SHARD)
    origin.stop()
    (root / ".tmp-v8-deadbeef").mkdir()  # crash while publishing v8
    (root / ".tmp-v8-deadbeef" / "shard_00001.bin").write_bytes(b"x")
    (root / "v9").mkdir()  # relay crashed before writing v9's manifest
    again = start_origin(root)
    servers.append(again)
    assert sorted(p.name for p in root.iterdir()) == ["v7"]
    assert httpx.get(f"{again.url}/health").json()["complete"] == [7]
    download(7, tmp_path / "out", [again.url])
    assert sha256(tmp_path / "out") == sha256(src)


def test_relay_restart_resumes_a_partial_version(tmp_path, servers):
    origin, src = published_origin(tmp_path, servers, 1 * MB, 2)
    relay = start_relay(origin.url, tmp_path / "relay")
    wait_until(lambda: complete_on(relay.url, 2), 30, "mirrored")
    relay.stop()
    for name in ("shard_00003.bin", "shard_00009.bin"):
        (tmp_path / "relay" / "v2" / name).unlink()
    (tmp_path / "relay" / "v2" / ".tmp-abc-shard_00004.bin").write_bytes(b"torn")
    again = start_relay(origin.url, tmp_path / "relay")
    servers.append(again)
    wait_until(lambda: complete_on(again.url, 2), 30, "resumed")
    assert not list((tmp_path / "relay" / "v2").glob(".tmp-*"))
    download(2, tmp_path / "out", [again.url])
    assert sha256(tmp_path / "out") == sha256(src)


def test_eight_clients_at_once_get_identical_files(tmp_path, servers):
    origin, relay = origin_and_relay(tmp_path, servers)
    src = random_file(tmp_path / "ckpt", 3 * MB)
    publish(origin.server.config.app.state.store, src, 4, SHARD)
    out = tmp_path / "out"
    out.mkdir()
    # Half the clients share one destination: their unique temp names must not collide.
    dests = [out / ("shared.bin" if i % 2 else f"c{i}.bin") for i in range(8)]
    errors: list[BaseException] = []

    def client(dest: Path) -> None:
        try:
            download(4, dest, [relay.url, origin.url], wait_seconds=20)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(d,)) for d in dests]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    want = sha256(src)
    assert {sha256(d) for d in set(dests)} == {want}
    assert sorted(p.name for p in out.iterdir()) == ["c0.bin", "c2.bin", "c4.bin", "c6.bin", "shared.bin"]


def test_keep_n_prunes_origin_and_relay(tmp_path, servers):
    origin = start_origin(tmp_path / "origin", keep=3)
    servers.append(origin)
    store: VersionStore = origin.server.config.app.state.store
    for version in range(1, 6):
        publish(store, random_file(tmp_path / f"s{version}", 100_000 + version), version, SHARD)
    assert store.versions() == [3, 4, 5]
    assert sorted(p.name for p in (tmp_path / "origin").iterdir()) == ["v3", "v4", "v5"]
    relay = start_relay(origin.url, tmp_path / "relay", keep=2)
    servers.append(relay)
    wait_until(lambda: complete_on(relay.url, 5) and complete_on(relay.url, 4), 30, "mirrored")
    assert httpx.get(f"{relay.url}/health").json()["versions"] == [4, 5]
    assert sorted(p.name for p in (tmp_path / "relay").iterdir()) == ["v4", "v5"]
    publish(store, random_file(tmp_path / "s6", 1000), 6, SHARD)
    wait_until(lambda: complete_on(relay.url, 6), 30, "v6 mirrored")
    assert httpx.get(f"{relay.url}/health").json()["versions"] == [5, 6]
    assert httpx.get(f"{origin.url}/distribution.txt").text.count("\n") == 3


def test_inference_checkpoint_store_uses_broadcast_source(tmp_path, servers):
    origin, relay = origin_and_relay(tmp_path, servers)
    src = random_file(tmp_path / "step_5.safetensors", 1 * MB)
    publish(origin.server.config.app.state.store, src, 5, SHARD)
    wait_until(lambda: complete_on(relay.url, 5), 30, "mirrored")
    store = CheckpointStore(f"broadcast:{relay.url},{origin.url}", tmp_path / "cache", keep=2)
    path = store.fetch(5)
    assert path == tmp_path / "cache" / "step_5.safetensors" and sha256(path) == sha256(src)
    assert store.sha256(5) == sha256(src) and store.versions() == [5]
    assert store.fetch(6) is None  # not published yet
    _corrupt_all_shards(tmp_path / "relay", 5)
    _corrupt_all_shards(tmp_path / "origin", 5)
    with pytest.raises(CheckpointError, match="step 5 from broadcast relays"):
        CheckpointStore(f"broadcast:{relay.url}", tmp_path / "cache2", keep=2).fetch(5)
    with pytest.raises(ValueError, match="no relay URL"):
        CheckpointStore("broadcast:", tmp_path / "cache3", keep=2)


def test_cli_publish_and_fetch(tmp_path, servers):
    origin = start_origin(tmp_path / "origin")
    servers.append(origin)
    src = random_file(tmp_path / "ckpt", 500_000)
    run = [sys.executable, "-c", "from workloads.broadcast.cli import main; main()", "--log-level", "warning"]
    pub = subprocess.run(
        [*run, "publish", str(src), "--version", "2", "--dir", str(tmp_path / "origin"), "--shard-size",
         str(SHARD), "--json"], capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert pub.returncode == 0, pub.stderr
    assert json.loads(pub.stdout)["shards"] == 8
    got = subprocess.run(
        [*run, "fetch", "--version", "2", "--out", str(tmp_path / "out"), "--relay", origin.url,
         "--wait", "10", "--json"], capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["digest"] == sha256(src) == sha256(tmp_path / "out")
    missing = subprocess.run(
        [*run, "fetch", "--version", "9", "--out", str(tmp_path / "x"), "--relay", origin.url],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert missing.returncode == 1 and "no relay holds version 9" in missing.stderr
