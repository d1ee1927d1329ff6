"""Read from a shardcast 0.3.2 server (origin or middle node) with our client machinery.

shardcast's wire format (from reading its source): `GET /distribution.txt` lists one version per
line as `v{N}: {blake3 hex of the whole file}|{number of shards}`; shards are
`GET /v{N}/shard_{i:05d}.bin`, i from 1, every shard `shard_size` bytes (50,000,000 by default, set
per broadcast) except the last. There are no per-shard hashes, so the only check is the whole-file
blake3 at the end; and no shard size is published, so we ask each shard's size with HEAD (its
server is Python's SimpleHTTPRequestHandler, which answers HEAD but ignores Range) and lay the
shards out by prefix sums. The bytes then stream into one preallocated file as with our relays.
"""

from __future__ import annotations

import http.client
import random
import time
from collections.abc import Sequence
from pathlib import Path

import blake3
import structlog

from workloads.broadcast.client import DownloadResult, Progress, ShardJob, Transfer
from workloads.broadcast.errors import VersionNotFound
from workloads.broadcast.manifest import shard_name
from workloads.broadcast.streams import ShardStreams, StreamError

log = structlog.get_logger(__name__)


def parse_distribution(text: str) -> dict[int, tuple[str, int]]:
    """{version: (blake3 hex, shard count)} from a distribution.txt; malformed lines are skipped."""
    found: dict[int, tuple[str, int]] = {}
    for line in text.splitlines():
        name, sep, info = line.partition(":")
        name, info = name.strip(), info.strip()
        checksum, bar, count = info.partition("|")
        if not sep or not bar or not name.startswith("v") or not name[1:].isdigit() or not count.isdigit():
            continue
        found[int(name[1:])] = (checksum.strip().lower(), int(count))
    return found


def _distribution(streams: ShardStreams, servers: Sequence[str]) -> dict[int, tuple[str, int]]:
    for server in servers:
        try:
            status, _, body = streams.fetch(server, "distribution.txt")
        except (StreamError, http.client.HTTPException, OSError):
            continue
        if status == 200:
            return parse_distribution(body.decode("utf-8", "replace"))
    return {}


def _shard_sizes(streams: ShardStreams, servers: Sequence[str], version: int, count: int) -> list[int]:
    sizes: list[int] = []
    for index in range(1, count + 1):
        for server in servers:
            try:
                status, headers, _ = streams.fetch(server, f"v{version}/{shard_name(index)}", method="HEAD")
            except (StreamError, http.client.HTTPException, OSError):
                continue
            length = headers.get("content-length", "")
            if status == 200 and length.isdigit():
                sizes.append(int(length))
                break
        else:
            raise VersionNotFound(f"v{version}: no shardcast server answers for {shard_name(index)}")
    return sizes


def download_shardcast(
    version: int, dest: Path | str, servers: Sequence[str], *, concurrency: int = 6, timeout: float = 30.0,
    wait_seconds: float = 0.0, progress: Progress | None = None, rng: random.Random | None = None,
) -> DownloadResult:  # fmt: skip
    """Download shardcast version `v{version}` into `dest`, verified by its whole-file blake3."""
    started = time.monotonic()
    with Transfer(servers, concurrency=concurrency, timeout=timeout, progress=progress, rng=rng) as transfer:
        deadline = started + wait_seconds
        while (entry := _distribution(transfer.streams, transfer.relays).get(version)) is None:
            if time.monotonic() >= deadline:
                raise VersionNotFound(f"no shardcast server lists v{version} in its distribution.txt")
            time.sleep(0.25)
        checksum, count = entry
        sizes = _shard_sizes(transfer.streams, transfer.relays, version, count)
        jobs, offset = [], 0
        for index, size in enumerate(sizes, start=1):
            jobs.append(ShardJob(index, offset, size, f"v{version}/{shard_name(index)}"))
            offset += size
        path, digest = transfer.run(
            jobs, offset, Path(dest), blake3.blake3(), checksum, f"shardcast v{version}"
        )
        result = DownloadResult(
            version, path, offset, digest, time.monotonic() - started, transfer.bytes_by_relay,
            transfer.rejected, transfer.resumed,
        )  # fmt: skip
    log.info("downloaded from shardcast", version=version, size=offset, seconds=round(result.seconds, 3))
    return result
