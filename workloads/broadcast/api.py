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
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
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


@dataclass
class Serving:
    """What the routes serve from, on `app.state.serving` (read by `get_serving`): the routes are
    module-level, so a route reaches its server's store and settings through a dependency rather than
    a closure over `create_app`'s arguments."""

    store: VersionStore
    role: str
    metrics: ServeMetrics
    shard_wait: float
    probe: bytes
    refresh: Callable[[], None] | None = None
    refreshed_at: float = 0.0

    async def refresh_once_per_step(self) -> None:
        """The origin's directory re-read at most once per step, however many long-polls wait (the
        first waiter of a step does it; the others read the store it refreshed)."""
        if self.refresh is not None and time.monotonic() - self.refreshed_at >= LONG_POLL_STEP:
            self.refreshed_at = time.monotonic()  # before the await: waiters of this step skip it
            await asyncio.to_thread(self.refresh)

    async def wait_newer(self, request: Request, after: int, wait: float) -> None:
        """Until a version newer than `after` is held, `wait` passes or the caller hangs up (a
        stopping relay): looked at every 50 ms on the event loop, no thread held per waiter."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            await self.refresh_once_per_step()
            if self.store.newest() > after or await request.is_disconnected():
                return
            await asyncio.sleep(LONG_POLL_STEP)

    async def hold_for_shard(self, version: int, index: int) -> None:
        """Return once shard `index` of `version` is held; on a relay it may still be arriving, so
        wait up to `shard_wait` for it (503 with Retry-After if it does not land, or the version goes)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shard_wait
        while not self.store.has_shard(version, index):
            if loop.time() >= deadline or self.store.manifest(version) is None:
                self.metrics.not_ready.inc()
                raise HTTPException(
                    503, f"shard {index} of version {version} is still arriving", headers={"Retry-After": "1"}
                )
            await asyncio.sleep(HOLD_POLL)


def get_serving(request: Request) -> Serving:
    serving: Serving = request.app.state.serving
    return serving


ServingDep = Annotated[Serving, Depends(get_serving)]

# No docstrings on the endpoints below: FastAPI would publish them as the OpenAPI description.


def versions_router(max_wait: float) -> APIRouter:
    """`GET /versions` in a router of its own, made with each app: the bound on `wait` is in the
    OpenAPI document, which FastAPI builds from the endpoint's signature, and `create_app` reads
    MAX_LONG_POLL when it makes the app (a test documents a shorter bound to keep a fuzzer's waits
    short). Its state comes through `ServingDep` like every other route's."""
    router = APIRouter()

    @router.get("/versions", summary="every version held, oldest first, with its manifest")
    async def versions(
        request: Request,
        serving: ServingDep,
        after: Annotated[
            int | None, Query(ge=0, description="with `wait`: answer once a version newer than this is held")
        ] = None,
        # A default, not an `Annotated` bound: with postponed annotations FastAPI resolves those in the
        # module's globals, where `max_wait` is not.
        wait: float = Query(
            0.0, ge=0, le=max_wait, description="long-poll: seconds to wait for a newer version"
        ),
    ) -> dict[str, Any]:
        if after is not None and wait > 0:
            await serving.wait_newer(request, after, wait)
        store = serving.store
        items = [
            {"version": m.version, "complete": store.is_complete(m.version), "manifest": m.model_dump()}
            for m in store.manifests()
        ]
        return {"role": serving.role, "versions": items}

    return router


router = APIRouter()
"""Every route but `GET /versions`; the manifest's route comes before the shard's, whose path would
also match `/v{N}/manifest.json`."""


@router.get("/v{version}/manifest.json", summary="manifest of one version")
def manifest(version: int, serving: ServingDep) -> Response:
    found = serving.store.manifest(version)
    if found is None:
        raise HTTPException(404, f"version {version} is not held here (held: {serving.store.versions()})")
    return Response(found.model_dump_json(), media_type="application/json")


@router.get("/v{version}/{name}", summary="one shard (Range supported)", response_class=FileResponse,
            responses={200: {"content": {"application/octet-stream": {}}}, 206: {"description": "a range",
                       "content": {"application/octet-stream": {}}}})  # fmt: skip
async def shard(version: int, name: str, request: Request, serving: ServingDep) -> Response:
    # response_class=FileResponse only documents the body (FastAPI's schema cannot read ShardFile)
    store = serving.store
    index = parse_shard_name(name)
    found = store.manifest(version)
    if found is None or index is None or not 1 <= index <= len(found.shards):
        raise HTTPException(404, f"no {name} in version {version} here (held: {store.versions()})")
    await serving.hold_for_shard(version, index)
    try:
        response = ShardFile(store.shard_path(version, index), request.headers.get("range"))
    except FileNotFoundError:  # pruned since it was looked up
        raise HTTPException(404, f"version {version} was pruned here") from None
    serving.metrics.shards_served.inc()
    serving.metrics.bytes_served.inc(response.end - response.start)
    return response  # by sendfile under the origin's and relay's protocol (sendfile.py)


@router.get("/distribution.txt", response_class=PlainTextResponse, summary="shardcast 0.3.2 version list")
def distribution(serving: ServingDep) -> str:
    return distribution_text(serving.store)


@router.get("/data1.bin", summary="shardcast 0.3.2 clients' speed probe", response_class=Response,
            responses={200: {"content": {"application/octet-stream": {}}}})  # fmt: skip
def data1(serving: ServingDep) -> Response:
    return Response(serving.probe, media_type="application/octet-stream")


@router.get("/health")
def health(serving: ServingDep) -> dict[str, Any]:
    held = serving.store.versions()
    return {"status": "ok", "role": serving.role, "versions": held,
            "complete": [v for v in held if serving.store.is_complete(v)]}  # fmt: skip


@router.get("/metrics", response_class=Response)
def prometheus(serving: ServingDep) -> Response:
    return Response(generate_latest(serving.metrics.registry), media_type=CONTENT_TYPE_LATEST)


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
    app.state.serving = Serving(store, role, metrics, shard_wait, b"\0" * probe_size, refresh)
    app.state.store = store  # for the origin's and relay's own code, and tests
    app.state.metrics = metrics
    app.include_router(versions_router(MAX_LONG_POLL))
    app.include_router(router)
    return guard(app, max_body=1024)
