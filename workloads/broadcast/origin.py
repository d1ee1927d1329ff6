"""The origin: publishes trainer checkpoints as versions and serves them to the first tier of relays.

`publish(store, path, version)` splits a file into the store (one streaming pass). The origin app
re-reads its directory every `poll_seconds`, so `intellect-broadcast publish --dir D` from another
process shows up without a restart, and with `watch` it follows a trainer checkpoint directory:
`step_<N>.safetensors` + `.sha256` sidecar + `step_<N>.json` written LAST by the trainer, so a step is
published only once its json exists, and only if the weights hash to what the json says.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import structlog
from fastapi import FastAPI

from workloads.broadcast.api import create_app
from workloads.broadcast.errors import BroadcastError, PublishError
from workloads.broadcast.manifest import DEFAULT_SHARD_SIZE, VersionManifest
from workloads.broadcast.store import VersionStore

log = structlog.get_logger(__name__)

STEP_JSON = re.compile(r"^step_(\d+)\.json$")


def publish(
    store: VersionStore, path: Path, version: int, shard_size: int = DEFAULT_SHARD_SIZE,
    expected_sha256: str | None = None,
) -> VersionManifest:  # fmt: skip
    """Publish `path` as `version` (== trainer step) into `store`; see VersionStore.publish."""
    if version < 1:
        raise PublishError(f"version {version}: versions are trainer steps, 1 or more")
    return store.publish(Path(path), version, shard_size, expected_sha256)


def _expected_sha256(checkpoints: Path, step: int) -> str:
    """The sha256 the trainer recorded for a step: its json manifest, cross-checked with the sidecar."""
    recorded = json.loads((checkpoints / f"step_{step}.json").read_text())
    sha = str(recorded.get("sha256", "")).lower()
    sidecar = checkpoints / f"step_{step}.safetensors.sha256"
    if sidecar.exists():
        side = (sidecar.read_text().split() or [""])[0].lower()
        if sha and side and side != sha:
            raise PublishError(f"step {step}: sidecar sha256 {side} != manifest sha256 {sha}")
        sha = sha or side
    if not sha:
        raise PublishError(f"step {step}: neither step_{step}.json nor the sidecar names a sha256")
    return sha


class CheckpointWatcher:
    """Publishes each new complete trainer step found in `checkpoints` (newer than what the store
    holds; on an empty store, the newest `keep`)."""

    def __init__(self, store: VersionStore, checkpoints: Path, shard_size: int = DEFAULT_SHARD_SIZE) -> None:
        self.store, self.checkpoints, self.shard_size = store, Path(checkpoints), shard_size
        self.failed: set[int] = set()

    def ready_steps(self) -> list[int]:
        if not self.checkpoints.is_dir():
            return []
        steps = sorted(int(m.group(1)) for p in self.checkpoints.iterdir() if (m := STEP_JSON.match(p.name)))
        held = self.store.versions()
        newest = max(held, default=0)
        fresh = [s for s in steps if s > newest and s not in self.failed and s >= 1]
        return fresh[-self.store.keep :]

    def scan_once(self) -> list[int]:
        """Publish every ready step; returns those published. A step that fails is logged and not
        retried (its files are not going to change), newer steps still go out."""
        done: list[int] = []
        for step in self.ready_steps():
            weights = self.checkpoints / f"step_{step}.safetensors"
            try:
                publish(self.store, weights, step, self.shard_size, _expected_sha256(self.checkpoints, step))
                done.append(step)
            except FileNotFoundError as exc:  # pruned by the trainer between listing and reading
                log.warning("checkpoint vanished before publishing", step=step, error=str(exc))
            except (BroadcastError, ValueError) as exc:
                self.failed.add(step)
                log.error("checkpoint not published", step=step, error=str(exc))
        return done


class OriginLoop:
    """Background thread of a running origin: refresh the store from disk, run the watcher."""

    def __init__(self, store: VersionStore, watcher: CheckpointWatcher | None, poll_seconds: float) -> None:
        self.store, self.watcher, self.poll = store, watcher, poll_seconds
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="broadcast-origin")

    def _run(self) -> None:
        while not self.stop.wait(self.poll):
            try:
                self.store.refresh()
                if self.watcher:
                    self.watcher.scan_once()
            except Exception:  # keep serving; the next round retries
                log.exception("origin background round failed")


def create_origin_app(
    store: VersionStore, *, watch: Path | None = None, shard_size: int = DEFAULT_SHARD_SIZE,
    poll_seconds: float = 1.0, probe_size: int = 1 << 20,
) -> FastAPI:  # fmt: skip
    """The origin's app; its lifespan runs the refresh/watch loop."""
    watcher = CheckpointWatcher(store, watch, shard_size) if watch else None
    loop = OriginLoop(store, watcher, poll_seconds)
    app = create_app(store, "origin", shard_wait=0.0, probe_size=probe_size, refresh=store.refresh)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if watcher:
            watcher.scan_once()
        loop.thread.start()
        try:
            yield
        finally:
            loop.stop.set()

    app.router.lifespan_context = lifespan
    app.state.watcher = watcher
    return app
