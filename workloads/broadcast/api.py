"""The HTTP face of an origin or relay (identical, so a relay can follow either).

Ours: `GET /versions` (every known version, with `complete`; `?after=N&wait=S` long-polls: it answers
the moment a version newer than N is held, so a new checkpoint reaches relays and waiting clients
without a poll interval), `GET /v{N}/manifest.json`,
`GET /v{N}/shard_{i:05d}.bin` (Range supported; sent by sendfile(2): sendfile.py), `/health`,
`/metrics`.
shardcast 0.3.2's, served from the same tree: `GET /distribution.txt` (`v{N}: {blake3}|{shards}` per
COMPLETE version, oldest first), the same shard URLs, and `GET /data1.bin`, the probe its clients
download from every server before anything else (they time it to seed their server scores).

On a relay a version is listed as soon as its manifest is known; a request for a shard still on its
way is held up to `shard_wait_seconds` and answered the moment the verified shard lands (503 with
Retry-After if it does not), so downstream transfers overlap the relay's own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from intellect.http_guard import guard
from workloads.broadcast.manifest import parse_shard_name
from workloads.broadcast.sendfile import ShardFile
from workloads.broadcast.store import VersionStore

MAX_LONG_POLL = 30.0
"""The longest a `GET /versions?after=N&wait=S` may wait."""
LONG_POLL_STEP = 0.05
"""How often a waiting long-poll looks for a new version (the origin re-reads its directory then)."""
HOLD_POLL = 0.005
"""How often a held shard request looks whether its shard landed: on the critical path of a client
that follows its relay shard by shard, and a look is one set lookup."""


class ShardResponse(FileResponse):
    """FileResponse with 1 MiB chunks: 16x fewer event-loop round trips than the 64 KiB default. Shards
    are served by sendfile.ShardFile; this is bench/broadcast.py's raw baseline server."""

    chunk_size = 1 << 20


class ServeMetrics:
    """Prometheus series of one server, in its own registry (several servers share a test process)."""

    def __init__(self, store: VersionStore, role: str) -> None:
        self.registry = CollectorRegistry()
        self.bytes_served = Counter(
            "broadcast_bytes_served", "shard bytes sent (Range-aware)", registry=self.registry
        )
        self.shards_served = Counter(
            "broadcast_shards_served", "shard responses sent", registry=self.registry
        )
        self.not_ready = Counter(
            "broadcast_shard_not_ready", "shard requests answered 503: still arriving", registry=self.registry
        )
        held = Gauge("broadcast_versions_held", "versions whose manifest is held", registry=self.registry)
        held.set_function(lambda: len(store.versions()))
        complete = Gauge("broadcast_versions_complete", "versions with every shard", registry=self.registry)
        complete.set_function(lambda: sum(store.is_complete(v) for v in store.versions()))
        self.role = role


def distribution_text(store: VersionStore) -> str:
    """shardcast's distribution.txt: complete versions only, oldest first."""
    lines = [
        f"v{m.version}: {m.blake3}|{len(m.shards)}\n"
        for m in store.manifests()
        if store.is_complete(m.version)
    ]
    return "".join(lines)


def create_app(
    store: VersionStore, role: str, shard_wait: float = 0.0, probe_size: int = 1 << 20,
    refresh: Callable[[], None] | None = None,
) -> FastAPI:  # fmt: skip
    """The app serving `store`; `shard_wait` > 0 on relays (shards may still be arriving). `refresh`
    (the origin's: re-read the directory `publish` writes into) runs every 50 ms while a long-poll of
    `/versions` waits; without it, a long-poll waits for the store to gain a version (a relay's
    follow loop adds them)."""
    app = FastAPI(title=f"Intellect broadcast {role}", version="1", description=__doc__)
    metrics = ServeMetrics(store, role)
    app.state.store = store
    app.state.metrics = metrics
    probe = b"\0" * probe_size

    refreshed_at = 0.0

    async def refresh_once_per_step() -> None:
        """The origin's directory re-read at most once per step, however many long-polls wait (the
        first waiter of a step does it; the others read the store it refreshed)."""
        nonlocal refreshed_at
        if refresh is not None and time.monotonic() - refreshed_at >= LONG_POLL_STEP:
            refreshed_at = time.monotonic()  # before the await: waiters of this step skip it
            await asyncio.to_thread(refresh)

    async def wait_newer(request: Request, after: int, wait: float) -> None:
        """Until a version newer than `after` is held, `wait` passes or the caller hangs up (a
        stopping relay): looked at every 50 ms on the event loop, no thread held per waiter."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            await refresh_once_per_step()
            if store.newest() > after or await request.is_disconnected():
                return
            await asyncio.sleep(LONG_POLL_STEP)

    @app.get("/versions", summary="every version held, oldest first, with its manifest")
    async def versions(
        request: Request,
        after: Annotated[
            int | None, Query(ge=0, description="with `wait`: answer once a version newer than this is held")
        ] = None,
        wait: Annotated[
            float, Query(ge=0, le=MAX_LONG_POLL, description="long-poll: seconds to wait for a newer version")
        ] = 0.0,
    ) -> dict[str, Any]:
        if after is not None and wait > 0:
            await wait_newer(request, after, wait)
        items = [
            {"version": m.version, "complete": store.is_complete(m.version), "manifest": m.model_dump()}
            for m in store.manifests()
        ]
        return {"role": role, "versions": items}

    @app.get("/v{version}/manifest.json", summary="manifest of one version")
    def manifest(version: int) -> Response:
        found = store.manifest(version)
        if found is None:
            raise HTTPException(404, f"version {version} is not held here (held: {store.versions()})")
        return Response(found.model_dump_json(), media_type="application/json")

    @app.get("/v{version}/{name}", summary="one shard (Range supported)", response_class=FileResponse,
             responses={200: {"content": {"application/octet-stream": {}}}, 206: {"description": "a range",
                        "content": {"application/octet-stream": {}}}})
    async def shard(version: int, name: str, request: Request) -> Response:
        # response_class=FileResponse only documents the body (FastAPI's schema cannot read ShardFile)
        index = parse_shard_name(name)
        found = store.manifest(version)
        if found is None or index is None or not 1 <= index <= len(found.shards):
            raise HTTPException(404, f"no {name} in version {version} here (held: {store.versions()})")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + shard_wait
        while not store.has_shard(version, index):
            if loop.time() >= deadline or store.manifest(version) is None:
                metrics.not_ready.inc()
                raise HTTPException(
                    503, f"shard {index} of version {version} is still arriving", headers={"Retry-After": "1"}
                )
            await asyncio.sleep(HOLD_POLL)
        try:
            response = ShardFile(store.shard_path(version, index), request.headers.get("range"))
        except FileNotFoundError:  # pruned since it was looked up
            raise HTTPException(404, f"version {version} was pruned here") from None
        metrics.shards_served.inc()
        metrics.bytes_served.inc(response.end - response.start)
        return response  # by sendfile under the origin's and relay's protocol (sendfile.py)

    @app.get("/distribution.txt", response_class=PlainTextResponse, summary="shardcast 0.3.2 version list")
    def distribution() -> str:
        return distribution_text(store)

    @app.get("/data1.bin", summary="shardcast 0.3.2 clients' speed probe", response_class=Response,
             responses={200: {"content": {"application/octet-stream": {}}}})
    def data1() -> Response:
        return Response(probe, media_type="application/octet-stream")

    @app.get("/health")
    def health() -> dict[str, Any]:
        held = store.versions()
        return {"status": "ok", "role": role, "versions": held,
                "complete": [v for v in held if store.is_complete(v)]}  # fmt: skip

    @app.get("/metrics", response_class=Response)
    def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return guard(app, max_body=1024)
