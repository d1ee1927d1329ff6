"""What the client trusts: per-shard blake3 (sha256 for older manifests) from the manifest, and, when
the caller has a whole-file sha256 from a better source (the trainer's step counter), that digest too.

A lying server is built by editing an origin's tree on disk: its manifest keeps the honest file's
whole sha256 but lists another file's shards (with their true hashes), as a relay that wants to
feed other weights would."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.broadcast.helpers import SHARD, random_file, sha256, start_origin
from workloads.broadcast.client import auto_concurrency, download
from workloads.broadcast.errors import ChecksumMismatch, ShardCorrupt
from workloads.broadcast.origin import publish

MB = 1_000_000


def test_older_manifests_without_blake3_are_checked_by_sha256(tmp_path, servers):
    root = tmp_path / "origin"
    origin = start_origin(root)
    src = random_file(tmp_path / "ckpt", MB)
    publish(origin.server.config.app.state.store, src, 1, SHARD)
    origin.stop()
    manifest_file = root / "v1" / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    for shard in manifest["shards"]:
        del shard["blake3"]
    manifest_file.write_text(json.dumps(manifest))
    again = start_origin(root)
    servers.append(again)
    download(1, tmp_path / "ok", [again.url])
    assert sha256(tmp_path / "ok") == sha256(src)

    shard = root / "v1" / "shard_00003.bin"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardCorrupt, match="shard 3 failed its sha256 check"):
        download(1, tmp_path / "bad", [again.url])
    assert not (tmp_path / "bad").exists()


def test_a_trusted_sha256_catches_a_manifest_that_lists_other_shards(tmp_path, servers):
    honest, other = tmp_path / "honest", tmp_path / "other"
    src, fake = random_file(tmp_path / "src", 2 * MB), random_file(tmp_path / "fake", 2 * MB)
    first = start_origin(honest)
    publish(first.server.config.app.state.store, src, 1, SHARD)
    first.stop()
    second = start_origin(other)
    publish(second.server.config.app.state.store, fake, 1, SHARD)
    second.stop()
    # The liar: the fake file's shards and shard hashes, under the honest file's whole sha256.
    lie = json.loads((other / "v1" / "manifest.json").read_text())
    lie["sha256"] = sha256(src)
    shutil.rmtree(honest / "v1")
    shutil.copytree(other / "v1", honest / "v1")
    (honest / "v1" / "manifest.json").write_text(json.dumps(lie))
    liar = start_origin(honest)
    servers.append(liar)

    with pytest.raises(ChecksumMismatch, match="expected " + sha256(src)):
        download(1, tmp_path / "out", [liar.url], expected_sha256=sha256(src))
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
    # Without a trusted digest the manifest is the anchor: each shard matched it, so the file is taken.
    result = download(1, tmp_path / "anchored", [liar.url])
    assert sha256(tmp_path / "anchored") == sha256(fake) and result.digest == lie["sha256"]


def test_trusted_sha256_of_an_honest_version_passes(tmp_path, servers):
    origin = start_origin(tmp_path / "origin")
    servers.append(origin)
    src = random_file(tmp_path / "src", 3 * MB + 17)
    publish(origin.server.config.app.state.store, src, 4, SHARD)
    result = download(4, tmp_path / "out", [origin.url], expected_sha256=sha256(src).upper())
    assert result.digest == sha256(src) == sha256(tmp_path / "out")


@pytest.mark.parametrize(
    ("relays", "cpus", "streams"), [(1, 2, 1), (1, 8, 2), (3, 8, 6), (10, 64, 8), (2, 1, 1)]
)
def test_auto_concurrency(relays: int, cpus: int, streams: int) -> None:
    assert auto_concurrency(relays, cpus) == streams
