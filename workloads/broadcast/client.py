"""Download one version from a set of relays into one file, verified, in bounded memory.

How, and why:
- Shards are fetched concurrently (auto_concurrency: by relays and cores) from relays chosen at
  random, weighted by success-rate EMA × bandwidth EMA, so a slow or failing relay gets less
  traffic but is not forgotten (its success rate heals a little on every other transfer).
- Each shard streams straight into its offset of a preallocated temp file, hashed on the way: no
  shard files, no join step. Per stream, the download thread receives into one of 3 × 1 MiB buffers
  and hashes it while a write-behind thread `os.pwrite`s the previous one (streams.WriteBehind):
  recv, blake3 and pwrite all release the GIL, so on 2 cores they overlap instead of adding up. A
  shard counts only once its writes are flushed and its hash matched. Manifests and shard bodies
  both go over http.client keep-alive connections (streams.py says why; no httpx client is built).
- A connection that drops mid-shard resumes with `Range: bytes=<received>-`, keeping the hash state,
  on the same or another relay (shards are identical everywhere, the shard's hash decides).
- A shard whose hash differs is rewritten from another relay; a relay that served it bad is not
  asked for that shard again. When every relay served it bad the version is dropped (ShardCorrupt).
- Shards are checked by blake3 when the manifest has it (4x cheaper than sha256 here), else sha256.
- Given a trusted whole-file sha256, a thread hashes the file in order, following the completed
  prefix, while the rest downloads; if it differs at the end the temp file is deleted
  (ChecksumMismatch). Only a fully verified file is renamed to `dest`. Temp names are unique per
  call: many clients may share a dir.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from workloads.broadcast.errors import (
    BroadcastError,
    ChecksumMismatch,
    ManifestMismatch,
    ShardCorrupt,
    ShardUnavailable,
    VersionNotFound,
)
from workloads.broadcast.manifest import BLOCK, Hasher, VersionManifest, new_hasher, shard_name
from workloads.broadcast.streams import (
    READ_BUFFER,
    ShardStreams,
    StreamError,
    WriteBehind,
    WriteFailed,
    WriterPool,
    preallocate,
)

log = structlog.get_logger(__name__)

Progress = Callable[[str, int, int], None]
"""Called as (relay url, shard index, bytes of that shard received so far) after every network read."""


MANIFEST_POLL = (0.05, 0.5)
"""While waiting for a version (`wait_seconds`): first pause between manifest polls, doubling up to the
second. A 404 costs the relay next to nothing, and a version usually appears within a relay poll."""


class _Cancelled(Exception):
    """Another shard failed: this one stops quietly."""


class RelayScores:
    """Weighted random relay choice: weight = success-rate EMA × bandwidth EMA (MB/s)."""

    ALPHA = 0.3
    HEAL = 0.01
    FLOOR = 1e-3

    def __init__(self, relays: Sequence[str], rng: random.Random | None = None) -> None:
        self.relays = list(relays)
        self.success = dict.fromkeys(self.relays, 1.0)
        self.bandwidth: dict[str, float | None] = dict.fromkeys(self.relays, None)
        self.rng = rng or random.Random()
        self._lock = threading.Lock()

    def weight(self, relay: str) -> float:
        known = [b for b in self.bandwidth.values() if b is not None]
        bandwidth = self.bandwidth[relay]
        if bandwidth is None:  # untried: as good as the best seen, so it gets explored
            bandwidth = max(known, default=1.0)
        return max(self.FLOOR, self.success[relay] * bandwidth)

    def pick(self, exclude: set[str]) -> str | None:
        with self._lock:
            choices = [r for r in self.relays if r not in exclude]
            if not choices:
                return None
            return self.rng.choices(choices, weights=[self.weight(r) for r in choices], k=1)[0]

    def record(self, relay: str, ok: bool, nbytes: int, seconds: float) -> None:
        with self._lock:
            for other in self.relays:
                self.success[other] = min(1.0, self.success[other] + self.HEAL)
            self.success[relay] = self.ALPHA * float(ok) + (1 - self.ALPHA) * self.success[relay]
            if ok and nbytes and seconds > 0:
                mbps = nbytes / seconds / 1e6
                old = self.bandwidth[relay]
                self.bandwidth[relay] = mbps if old is None else self.ALPHA * mbps + (1 - self.ALPHA) * old


@dataclass
class ShardJob:
    """One byte range of the destination file and where to get it (`path` under each relay)."""

    index: int
    offset: int
    size: int
    path: str
    check: tuple[str, str] | None = None  # (algorithm, hex digest); None: only the whole file is checked


@dataclass
class DownloadResult:
    version: int
    path: Path
    size: int
    digest: str
    seconds: float
    bytes_by_relay: dict[str, int] = field(default_factory=dict)
    rejected_shards: int = 0
    resumed_requests: int = 0

    @property
    def mb_per_s(self) -> float:
        return self.size / 1e6 / max(self.seconds, 1e-9)

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "path": str(self.path), "size": self.size, "digest": self.digest,
                "seconds": round(self.seconds, 3), "mb_per_s": round(self.mb_per_s, 1),
                "bytes_by_relay": self.bytes_by_relay, "rejected_shards": self.rejected_shards,
                "resumed_requests": self.resumed_requests}  # fmt: skip


class _InOrderHasher(threading.Thread):
    """Hashes the destination file shard by shard, in order, as soon as each shard is final, by
    reading it back (from the page cache). Runs alongside the downloads, so at the end only the tail
    is left to hash."""

    def __init__(self, fd: int, jobs: Sequence[ShardJob], hasher: Hasher, stop: threading.Event) -> None:
        super().__init__(daemon=True, name="broadcast-hash")
        self.fd, self.jobs, self.hasher, self.stop = fd, list(jobs), hasher, stop
        self.done: set[int] = set()
        self.cond = threading.Condition()
        self.error: BaseException | None = None

    def mark_done(self, index: int) -> None:
        with self.cond:
            self.done.add(index)
            self.cond.notify()

    def run(self) -> None:
        try:
            for job in self.jobs:
                with self.cond:
                    while job.index not in self.done and not self.stop.is_set():
                        self.cond.wait(0.2)
                if self.stop.is_set():
                    return
                pos, end = job.offset, job.offset + job.size
                while pos < end:
                    block = os.pread(self.fd, min(BLOCK, end - pos), pos)
                    if not block:
                        raise OSError(f"short read at byte {pos} of the temp file")
                    self.hasher.update(block)
                    pos += len(block)
        except BaseException as exc:  # reported by the caller after join()
            self.error = exc


class Transfer:
    """Runs a list of ShardJobs from several relays into one file; shared by our protocol and the
    shardcast reader (which has no per-shard hashes, only a whole-file blake3)."""

    def __init__(
        self, relays: Sequence[str], *, concurrency: int = 6, timeout: float = 30.0,
        progress: Progress | None = None, rng: random.Random | None = None,
        buffer_size: int = READ_BUFFER, write_depth: int = 3,
    ) -> None:  # fmt: skip
        if not relays:
            raise ValueError("no relay given: pass at least one URL")
        self.relays = [r.rstrip("/") for r in relays]
        self.scores = RelayScores(self.relays, rng)
        self.concurrency = max(1, concurrency)
        self.buffer_size, self.write_depth = max(1, buffer_size), max(1, write_depth)
        self.progress = progress
        # Manifests and shard bodies alike over http.client keep-alive connections: no httpx client to
        # build (its TLS context alone cost 0.1-0.15 s per download on this machine).
        self.streams = ShardStreams(timeout)
        self.stop = threading.Event()
        self.max_attempts = max(6, 4 * len(self.relays))
        self._stats_lock = threading.Lock()
        self.bytes_by_relay: dict[str, int] = dict.fromkeys(self.relays, 0)
        self.rejected = 0
        self.resumed = 0

    def await_version(self, version: int, left: float) -> bool:
        """Long-poll the first relay's `/versions` until it holds `version` (at most `left` seconds,
        1 at a time, as relays do). False when that relay cannot long-poll (a shardcast server, an
        older one) or failed: the caller falls back to polling the manifest."""
        wait = max(0.0, min(left, 1.0))
        relay, started = self.relays[0], time.monotonic()
        try:
            status, _, body = self.streams.fetch(relay, f"versions?after={version - 1}&wait={wait:.2f}")
            listed = {int(v["version"]) for v in json.loads(body)["versions"]} if status == 200 else set()
        except (StreamError, OSError, http.client.HTTPException, ValueError, KeyError, TypeError):
            return False
        return version in listed or time.monotonic() - started >= wait / 2

    def close(self) -> None:
        self.streams.close()

    def __enter__(self) -> Transfer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self, jobs: Sequence[ShardJob], size: int, dest: Path, whole: Hasher | None, expected: str, what: str
    ) -> tuple[Path, str]:
        """Download `jobs` into `dest` (size bytes). With `whole`, the whole file's digest must equal
        `expected` (hashed in order beside the downloads); without, every job must carry its own check
        and `expected` is returned as the digest. `what` names the version in errors."""
        if whole is None and any(job.check is None for job in jobs):
            raise ValueError("a transfer without a whole-file hash needs a check on every shard")
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}-{uuid.uuid4().hex[:12]}.part")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        hasher = _InOrderHasher(fd, jobs, whole, self.stop) if whole is not None else None
        writers = WriterPool(self.buffer_size, self.write_depth)
        ok = False
        try:
            try:
                preallocate(fd, size)
            except OSError as exc:  # a full disk: say so now, not after a failed write per shard
                raise BroadcastError(f"{what}: cannot allocate {size} bytes at {tmp}: {exc}") from exc
            if hasher is not None:
                hasher.start()
            with ThreadPoolExecutor(max(1, min(self.concurrency, len(jobs))), "broadcast-shard") as pool:
                futures = [pool.submit(self._fetch, job, fd, writers, hasher, what) for job in jobs]
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                failed = [e for f in done if (e := f.exception()) is not None]
                if failed:
                    self.stop.set()
                    for future in futures:
                        future.cancel()
                    raise next((e for e in failed if not isinstance(e, _Cancelled)), failed[0])
            digest = expected
            if hasher is not None and whole is not None:
                hasher.join()
                if hasher.error is not None:
                    raise BroadcastError(f"{what}: could not hash the downloaded file: {hasher.error}")
                digest = whole.hexdigest()
                if digest != expected:
                    raise ChecksumMismatch(
                        f"{what}: assembled file hashes to {digest}, expected {expected}; version dropped"
                    )
            os.replace(tmp, dest)  # no fsync: a checkpoint lost to a power cut is simply fetched again
            ok = True
            return dest, digest
        finally:
            self.stop.set()
            writers.close()  # every _fetch drained its writes before returning: nothing is pending
            os.close(fd)
            if not ok:
                tmp.unlink(missing_ok=True)

    def _fetch(
        self, job: ShardJob, fd: int, writers: WriterPool, hasher: _InOrderHasher | None, what: str
    ) -> None:
        writer = writers.get()
        try:
            self._fetch_into(job, fd, writer, hasher, what)
        finally:
            writer.drain()  # nothing of this shard may still be queued once it returns (fd closes after)

    def _fetch_into(
        self, job: ShardJob, fd: int, writer: WriteBehind, hasher: _InOrderHasher | None, what: str
    ) -> None:
        algorithm = job.check[0] if job.check else "sha256"
        received, digest = 0, new_hasher(algorithm)
        corrupt_from: set[str] = set()  # relays that served this shard with the wrong hash
        down: set[str] = set()  # relays that failed this shard on the network side, cleared on backoff
        sources: set[str] = set()  # relays that contributed to the current partial bytes
        errors: list[str] = []
        backoff = 0.2
        for _ in range(self.max_attempts):
            if self.stop.is_set():
                raise _Cancelled()
            relay = self.scores.pick(corrupt_from | down)
            if relay is None:
                if len(corrupt_from) == len(self.relays):
                    break
                time.sleep(backoff)  # every relay failed recently: wait, then try them all again
                backoff = min(2.0, backoff * 2)
                down.clear()
                continue
            start, got = time.monotonic(), 0
            try:
                with self.streams.get(relay, job.path, received) as resp:
                    if received and resp.status == 206:
                        with self._stats_lock:
                            self.resumed += 1
                    elif resp.status == 200:
                        received, digest, sources = 0, new_hasher(algorithm), set()
                    sources.add(relay)
                    # Read into a free buffer, queue it for the file, hash it meanwhile: the writer
                    # thread copies buffer k into the file while this one receives buffer k+1.
                    too_much = f"more than the {job.size} bytes of the shard"
                    for view, n in writer.chunks(resp, job.size - received, too_much):
                        writer.write(fd, view, n, job.offset + received)
                        digest.update(view[:n])  # blake3 and sha256 release the GIL on buffers this big
                        received += n
                        got += n
                        if self.stop.is_set():
                            raise _Cancelled()
                        if self.progress:
                            self.progress(relay, job.index, received)
                if received != job.size:
                    raise StreamError(f"shard ended at {received} of {job.size} bytes")
                writer.flush()  # the shard's bytes are in the file before it counts
            except (StreamError, http.client.HTTPException, OSError) as exc:
                # What was read before the error is good and kept for the resume (Range from
                # `received`), unless a write failed: then where the file stops is unknown, restart.
                if isinstance(exc, WriteFailed) or writer.drain() is not None:
                    received, digest, sources = 0, new_hasher(algorithm), set()
                self._count(relay, got)
                self.scores.record(relay, False, got, time.monotonic() - start)
                down.add(relay)
                errors.append(f"{relay}: {exc or type(exc).__name__}")
                continue
            self._count(relay, got)
            if job.check is not None and digest.hexdigest() != job.check[1]:
                self.scores.record(relay, False, got, time.monotonic() - start)
                corrupt_from |= sources
                errors.append(f"{relay}: {algorithm} {digest.hexdigest()} != {job.check[1]}")
                with self._stats_lock:
                    self.rejected += 1
                log.warning(
                    "shard rejected", what=what, shard=job.index, relay=relay, reason=f"{algorithm} mismatch"
                )
                received, digest, sources = 0, new_hasher(algorithm), set()
                continue
            self.scores.record(relay, True, got, time.monotonic() - start)
            if hasher is not None:
                hasher.mark_done(job.index)
            return
        if corrupt_from and len(corrupt_from) == len(self.relays):
            raise ShardCorrupt(
                f"{what}: shard {job.index} failed its {algorithm} check from every relay "
                f"({', '.join(sorted(corrupt_from))}); version dropped"
            )
        raise ShardUnavailable(
            f"{what}: shard {job.index} could not be fetched after {self.max_attempts} attempts: "
            + "; ".join(errors[-4:])
        )

    def _count(self, relay: str, nbytes: int) -> None:
        with self._stats_lock:
            self.bytes_by_relay[relay] += nbytes


def fetch_manifest(
    streams: ShardStreams, relays: Sequence[str], version: int, expected_sha256: str | None = None
) -> VersionManifest:
    """The version's manifest from the first relay that has it (and agrees with `expected_sha256`)."""
    problems: list[str] = []
    for relay in relays:
        try:
            status, _, body = streams.fetch(relay, f"v{version}/manifest.json")
        except (StreamError, http.client.HTTPException, OSError) as exc:
            problems.append(f"{relay}: {exc or type(exc).__name__}")
            continue
        if status != 200:
            problems.append(f"{relay}: HTTP {status}")
            continue
        manifest = VersionManifest.parse(body, f"manifest of v{version} from {relay}")
        if manifest.version != version:
            problems.append(f"{relay}: answered with version {manifest.version}")
            continue
        if expected_sha256 and manifest.sha256 != expected_sha256.lower():
            raise ManifestMismatch(
                f"v{version} from {relay} has sha256 {manifest.sha256}, expected {expected_sha256}"
            )
        return manifest
    raise VersionNotFound(f"no relay holds version {version}: " + "; ".join(problems))


def auto_concurrency(relays: int, cpus: int | None = None) -> int:
    """Shards fetched at once when the caller does not say: two per relay (a second stream hides a
    relay's per-request latency), at most one per core beyond the first (each stream is a download
    thread plus its write-behind thread; on 2 cores one stream was as fast as two on loopback, with
    less CPU, docs/broadcast.md), at most 8."""
    cores = cpus if cpus is not None else (os.cpu_count() or 1)
    return max(1, min(2 * relays, cores - 1, 8))


def download(
    version: int, dest: Path | str, relays: Sequence[str], *, expected_sha256: str | None = None,
    concurrency: int | None = None, timeout: float = 30.0, wait_seconds: float = 0.0,
    progress: Progress | None = None, rng: random.Random | None = None,
) -> DownloadResult:  # fmt: skip
    """Download `version` into `dest`, every shard verified against its manifest.

    With `expected_sha256` (a digest from a source you trust more than the relays, e.g. the trainer's
    step counter) the manifest must carry it and the assembled file is hashed again, beside the
    downloads, to bind the shards to it. Without, the manifest is the trust anchor: the file is the
    concatenation of shards that each matched it, and its sha256 is the manifest's.

    `wait_seconds` > 0 polls the relays that long for a version not published yet. Raises a
    BroadcastError subclass; on any failure `dest` is left untouched and no temp file remains."""
    started = time.monotonic()
    streams = concurrency if concurrency is not None else auto_concurrency(len(relays))
    with Transfer(relays, concurrency=streams, timeout=timeout, progress=progress, rng=rng) as transfer:
        deadline, pause = started + wait_seconds, MANIFEST_POLL[0]
        while True:
            try:
                manifest = fetch_manifest(transfer.streams, transfer.relays, version, expected_sha256)
                break
            except VersionNotFound:
                if time.monotonic() >= deadline:
                    raise
                if not transfer.await_version(version, deadline - time.monotonic()):
                    time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                    pause = min(MANIFEST_POLL[1], pause * 2)
        jobs = [
            ShardJob(s.index, s.offset, s.size, f"v{version}/{shard_name(s.index)}", s.check())
            for s in manifest.shards
        ]
        whole = hashlib.sha256() if expected_sha256 else None
        path, digest = transfer.run(jobs, manifest.size, Path(dest), whole, manifest.sha256, f"v{version}")
        result = DownloadResult(
            version, path, manifest.size, digest, time.monotonic() - started, transfer.bytes_by_relay,
            transfer.rejected, transfer.resumed,
        )  # fmt: skip
    log.info("downloaded", **{k: v for k, v in result.as_dict().items() if k != "bytes_by_relay"})
    return result
