"""The discovery HTTP service: `create_app(settings)` returns the FastAPI app (see docs/orchestrator.md).

Why this shape: routes live in `discovery.api.routes` as module-level routers reading their state
through `discovery.api.deps` from `app.state`. This module decides what goes there: settings, the
admin token and the metrics when the app is built; the Redis-backed store, the cached chain view and
the request verifier in the lifespan, which also runs the on-chain sync loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import structlog
from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from redis.asyncio import Redis
from redis.exceptions import RedisError
from requests.exceptions import ConnectionError as RequestsConnectionError

from discovery.api.deps import DiscoveryMetrics
from discovery.api.routes import health, invites, nodes, pools
from discovery.chain import CachedChainView, ChainView, LedgerChainView
from discovery.checks import read_flags
from discovery.invite_box import InviteBox
from discovery.settings import DiscoverySettings
from discovery.store import NodeStore
from intellect.auth import (
    AdminToken,
    RedisNonceStore,
    RedisRateLimiter,
    RequestVerifier,
    load_or_create_admin_token,
)
from intellect.http_guard import guard
from intellect.redis_server import redis_url_or_embedded
from intellect.wire.nodes import DiscoveredNode

log = structlog.get_logger("intellect.discovery")


def ledger_chain_view(settings: DiscoverySettings) -> ChainView:
    from ledger.client import LedgerClient
    from ledger.deploy import Deployment

    if not settings.deployment.exists():
        raise SystemExit(f"no deployment file at {settings.deployment}: pass --deployment or deploy first")
    return LedgerChainView(LedgerClient(settings.rpc_url, Deployment.load(settings.deployment), None))


async def refresh(chain: CachedChainView, settings: DiscoverySettings,
                  record: DiscoveredNode) -> DiscoveredNode:
    """The record with its on-chain flags read again (registration, blacklist, pool membership)."""
    flags = await run_in_threadpool(read_flags, chain, record.metadata.node_address,
                                    record.metadata.provider_address, settings.pool_id)
    return record.model_copy(update={"on_chain": flags})


async def sync_loop(store: NodeStore, chain: CachedChainView, settings: DiscoverySettings,
                    metrics: DiscoveryMetrics) -> None:
    """Refresh every record's on-chain flags every `sync_interval_seconds`: a node blacklisted or
    ejected after its upload must stop being offered before its record expires."""
    while True:
        await asyncio.sleep(settings.sync_interval_seconds)
        try:
            records = await store.all()
            for record in records:
                updated = await refresh(chain, settings, record)
                if updated.on_chain != record.on_chain:
                    await store.update_flags(updated)
            metrics.known.set(len(records))
            metrics.syncs.inc()
        except Exception:  # keep syncing through a transient RPC or Redis failure
            log.exception("discovery sync failed")


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Redis (embedded unless configured), the chain view, store and verifier on `app.state`, the sync
    loop. `app.state.chain_view` is the `chain` given to `create_app` (None: a LedgerClient)."""
    state = app.state
    settings: DiscoverySettings = state.settings
    url, embedded = redis_url_or_embedded(settings.redis_url, settings.state_dir)
    redis = Redis.from_url(url)
    view: ChainView = state.chain_view or await run_in_threadpool(ledger_chain_view, settings)
    state.chain = CachedChainView(view, settings.chain_cache_seconds)
    state.store = NodeStore(redis, settings.record_ttl_seconds)
    state.invites = InviteBox(redis)
    state.verifier = RequestVerifier(
        RedisNonceStore(redis, prefix="discovery:nonce"),
        RedisRateLimiter(redis, settings.rate_limit_per_minute, 60, prefix="discovery:rate"),
        settings.max_skew_seconds,
    )
    sync_task = asyncio.create_task(sync_loop(state.store, state.chain, settings, state.metrics))
    try:
        yield
    finally:
        sync_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sync_task
        await redis.aclose()
        if embedded:
            embedded.stop()


def create_app(settings: DiscoverySettings, chain: ChainView | None = None) -> FastAPI:
    """Build the app. `chain` defaults to a LedgerClient from settings (rpc_url, deployment)."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    app = FastAPI(title="Intellect discovery", version="0.1.0", lifespan=lifespan,
                  description="Signed node metadata, checked on chain, served by access tier.")
    app.state.settings = settings
    app.state.chain_view = chain
    app.state.metrics = DiscoveryMetrics()
    app.state.admin = AdminToken(load_or_create_admin_token(settings.admin_token_file))
    for module in (health, nodes, invites, pools):
        app.include_router(module.router)
    return guard(app, unavailable=[(RedisError, 503, "redis"), (RequestsConnectionError, 502, "chain (RPC)")])
