"""A relay: follows one upstream (the origin or another relay) and re-serves what it mirrors.

Pipelined: as soon as the upstream lists a version, the relay stores its manifest (the version is
listed here from then on) and fetches its shards, `relay_concurrency` at a time, in index order, the
order clients ask for them. Each shard is streamed to a temp file (written behind the reads, as in
the client: streams.WriteBehind), its hash checked (blake3; sha256 in older manifests), and only
once its writes are flushed and the hash matched is it renamed into place, the moment from which
it is served; a downstream request that arrived earlier was held by the app (see api.py) and is
answered right away. A shard with the wrong hash is discarded and fetched again on the next
round: a relay never serves a bad shard it fetched.

Only the newest `keep` versions are mirrored: older ones would be pruned on arrival anyway.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import structlog
from fastapi import FastAPI
from prometheus_client import Counter

from workloads.broadcast.api import create_app
from workloads.broadcast.errors import BroadcastError
from workloads.broadcast.manifest import VersionManifest, new_hasher, shard_name
from workloads.broadcast.store import VersionStore
from workloads.broadcast.streams import ShardStreams, StreamError, WriterPool, preallocate

LONG_POLL_SECONDS = 1.0
"""An idle relay long-polls its upstream's `/versions` this long: a new version reaches it at once,
not a poll interval later (the upstream answers early). Short, because a server stopping waits for
the long-polls it holds (at most this long)."""

log = structlog.get_logger(__name__)


class Relay:
    """The follow loop of a relay; `start()` runs it in a thread, `stop()` ends it."""

    def __init__(
        self, upstream: str, store: VersionStore, *, concurrency: int = 4, poll_seconds: float = 1.0,
        timeout: float = 30.0, fetched: Counter | None = None, rejected: Counter | None = None,
    ) -> None:  # fmt: skip
        self.upstream = upstream.rstrip("/")
        self.store = store
        self.poll = poll_seconds
        self.timeout = timeout
        self.streams = ShardStreams(timeout)  # version lists and shard bodies (streams.py: why not httpx)
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix="relay-fetch")
        self.writers = WriterPool()  # each fetch thread's WriteBehind
        self.in_flight: set[tuple[int, int]] = set()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="relay-follow")
        self.fetched, self.rejected = fetched, rejected
        self.upstream_ok = False

    def start(self) -> Relay:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.streams.close()  # ends a long-poll (and shard fetches) in flight now, not when answered
        self.thread.join(timeout=10)
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.writers.close()

    def _idle(self) -> bool:
        """Nothing in flight and every held version complete: only a new version means work."""
        with self.lock:
            if self.in_flight:
                return False
        return all(not self.store.missing_shards(v) for v in self.store.versions())

    def _run(self) -> None:
        while not self.stopped.is_set():
            wait = min(LONG_POLL_SECONDS, self.timeout / 2) if self._idle() else 0.0
            started = time.monotonic()
            try:
                self.sync_once(wait)
                self.upstream_ok = True
                if wait and time.monotonic() - started >= wait / 2:
                    continue  # the upstream held the long-poll: ask again at once
            except (
                StreamError,
                OSError,
                http.client.HTTPException,
                BroadcastError,
                ValueError,
                KeyError,
            ) as exc:
                if self.stopped.is_set():
                    return  # stop() shut the connections down under a long-poll
                self.upstream_ok = False
                log.warning("upstream unreachable or invalid", upstream=self.upstream, error=str(exc))
            # Shards to retry, an answer that came early (a new version: its shards are queued), or an
            # upstream that does not long-poll: the plain poll interval.
            self.stopped.wait(self.poll)

    def sync_once(self, wait: float = 0.0) -> None:
        """One round: learn new versions from upstream, queue every missing shard not in flight.
        `wait` > 0 long-polls: the upstream answers once it holds a version newer than ours."""
        path = f"versions?after={self.store.newest()}&wait={wait:.2f}" if wait else "versions"
        status, _, body = self.streams.fetch(self.upstream, path)
        if status != 200:
            raise BroadcastError(f"{self.upstream}/versions answered {status}: {body[:200]!r}")
        listed: list[dict[str, Any]] = json.loads(body)["versions"]
        wanted = sorted(int(item["version"]) for item in listed)[-self.store.keep :]
        held = self.store.versions()
        for item in listed:
            version = int(item["version"])
            if version not in wanted or version in held:
                continue
            if held and version < min(held) and len(held) >= self.store.keep:
                continue  # older than everything kept: it would be pruned on arrival
            manifest = VersionManifest.model_validate(item["manifest"])
            if self.store.add_manifest(manifest):
                log.info("mirroring", version=version, shards=len(manifest.shards), size=manifest.size)
        for manifest in self.store.manifests():
            for index in self.store.missing_shards(manifest.version):
                key = (manifest.version, index)
                with self.lock:
                    if key in self.in_flight or self.stopped.is_set():
                        continue
                    self.in_flight.add(key)
                self.pool.submit(self._fetch_guarded, manifest, index)

    def _fetch_guarded(self, manifest: VersionManifest, index: int) -> None:
        try:
            self.fetch_shard(manifest, index)
        except Exception as exc:  # the next round queues the shard again
            log.warning("shard fetch failed", version=manifest.version, shard=index, error=str(exc))
        finally:
            with self.lock:
                self.in_flight.discard((manifest.version, index))

    def fetch_shard(self, manifest: VersionManifest, index: int) -> bool:
        """Fetch, verify and commit one shard. False if it was bad (discarded) or the version pruned."""
        info = manifest.shard(index)
        if self.store.manifest(manifest.version) is None:
            return False
        tmp = self.store.temp_shard(manifest.version, index)
        algorithm, expected = info.check()
        digest = new_hasher(algorithm)
        writer = self.writers.get()  # the file is written behind the reads, as in the client
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            preallocate(fd, info.size)
            path = f"v{manifest.version}/{shard_name(index)}"
            with self.streams.get(self.upstream, path) as resp:
                received = 0
                too_much = f"upstream sent more than the shard's {info.size} bytes"
                for view, n in writer.chunks(resp, info.size, too_much):
                    if self.stopped.is_set():
                        writer.release(view)
                        return False
                    writer.write(fd, view, n, received)
                    digest.update(view[:n])
                    received += n
            if received != info.size:  # cut short: not corrupt, just incomplete
                raise StreamError(f"upstream sent {received} of the shard's {info.size} bytes")
            writer.flush()
            if digest.hexdigest() != expected:
                if self.rejected is not None:
                    self.rejected.inc()
                log.warning(f"upstream shard rejected: {algorithm} mismatch, will refetch",
                            version=manifest.version, shard=index, upstream=self.upstream)  # fmt: skip
                return False
            committed = self.store.commit_shard(manifest.version, index, tmp)
            if committed and self.fetched is not None:
                self.fetched.inc()
            return committed
        finally:
            writer.drain()  # before the fd closes
            os.close(fd)
            tmp.unlink(missing_ok=True)


def create_relay_app(
    upstream: str, store: VersionStore, *, concurrency: int = 4, poll_seconds: float = 1.0,
    shard_wait: float = 10.0, timeout: float = 30.0, probe_size: int = 1 << 20,
) -> FastAPI:  # fmt: skip
    """The relay's app; its lifespan starts and stops the follow loop."""
    app = create_app(store, "relay", shard_wait=shard_wait, probe_size=probe_size)
    registry = app.state.metrics.registry
    fetched = Counter("broadcast_shards_fetched", "verified shards fetched from upstream", registry=registry)
    rejected = Counter("broadcast_shards_rejected", "upstream shards failing sha256", registry=registry)
    relay = Relay(upstream, store, concurrency=concurrency, poll_seconds=poll_seconds, timeout=timeout,
                  fetched=fetched, rejected=rejected)  # fmt: skip
    app.state.relay = relay

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        relay.start()
        try:
            yield
        finally:
            relay.stop()

    app.router.lifespan_context = lifespan
    return app
