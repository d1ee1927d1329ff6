"""The discovery HTTP service: `create_app(settings)` returns the FastAPI app (see docs/orchestrator.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

from eth_utils import is_address, to_checksum_address
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from redis.asyncio import Redis

from discovery.chain import CachedChainView, ChainView, LedgerChainView
from discovery.checks import Refused, admit, read_flags
from discovery.settings import DiscoverySettings
from discovery.store import NodeStore
from intellect.auth import (
    AdminToken,
    RedisNonceStore,
    RedisRateLimiter,
    RequestVerifier,
    load_or_create_admin_token,
)
from intellect.redis_server import EmbeddedRedis
from intellect.wire.nodes import DiscoveredNode, NodeMetadata
from intellect.wire.requirements import parse_pool_requirements

log = logging.getLogger("intellect.discovery")


@dataclass(frozen=True)
class Caller:
    """Who is reading: the admin (bearer token) or a signed address."""

    admin: bool = False
    address: str | None = None


def ledger_chain_view(settings: DiscoverySettings) -> ChainView:
    from ledger.client import LedgerClient
    from ledger.deploy import Deployment

    if not settings.deployment.exists():
        raise SystemExit(f"no deployment file at {settings.deployment}: pass --deployment or deploy first")
    return LedgerChainView(LedgerClient(settings.rpc_url, Deployment.load(settings.deployment), None))


def create_app(settings: DiscoverySettings, chain: ChainView | None = None) -> FastAPI:
    """Build the app. `chain` defaults to a LedgerClient from settings (rpc_url, deployment)."""
    state: dict[str, object] = {}
    registry = CollectorRegistry()
    uploads = Counter("discovery_uploads", "metadata uploads by result", ["result"], registry=registry)
    known = Gauge("discovery_nodes", "node records held", registry=registry)
    syncs = Counter("discovery_syncs", "background on-chain refreshes", registry=registry)

    settings.state_dir.mkdir(parents=True, exist_ok=True)
    admin = AdminToken(load_or_create_admin_token(settings.admin_token_file))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        embedded = None
        url = settings.redis_url
        if url is None:
            embedded = EmbeddedRedis(data_dir=settings.state_dir / "redis").start()
            url = embedded.url
        redis = Redis.from_url(url)
        view = chain or await run_in_threadpool(ledger_chain_view, settings)
        state["chain"] = CachedChainView(view, settings.chain_cache_seconds)
        state["store"] = NodeStore(redis, settings.record_ttl_seconds)
        state["verifier"] = RequestVerifier(
            RedisNonceStore(redis, prefix="discovery:nonce"),
            RedisRateLimiter(redis, settings.rate_limit_per_minute, 60, prefix="discovery:rate"),
            settings.max_skew_seconds,
        )
        sync_task = asyncio.create_task(sync_loop())
        try:
            yield
        finally:
            sync_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sync_task
            await redis.aclose()
            if embedded:
                embedded.stop()

    def store() -> NodeStore:
        return state["store"]  # type: ignore[return-value]

    def chain_view() -> CachedChainView:
        return state["chain"]  # type: ignore[return-value]

    async def signed(request: Request) -> str:
        verifier: RequestVerifier = state["verifier"]  # type: ignore[assignment]
        return await verifier.verify(request)

    async def caller(request: Request) -> Caller:
        if request.headers.get("authorization"):
            await admin(request)
            return Caller(admin=True)
        return Caller(address=await signed(request))

    async def is_validator(address: str) -> bool:
        return await run_in_threadpool(chain_view().is_validator, address)

    async def refresh(record: DiscoveredNode) -> DiscoveredNode:
        flags = await run_in_threadpool(read_flags, chain_view(), record.metadata.node_address,
                                        record.metadata.provider_address, settings.pool_id)
        return record.model_copy(update={"on_chain": flags})

    async def sync_loop() -> None:
        """Refresh every record's on-chain flags (registration, blacklist, pool membership)."""
        while True:
            await asyncio.sleep(settings.sync_interval_seconds)
            try:
                records = await store().all()
                for record in records:
                    updated = await refresh(record)
                    if updated.on_chain != record.on_chain:
                        await store().update_flags(updated)
                known.set(len(records))
                syncs.inc()
            except Exception:  # keep syncing through a transient RPC or Redis failure
                log.exception("discovery sync failed")

    app = FastAPI(title="Intellect discovery", version="0.1.0", lifespan=lifespan,
                  description="Signed node metadata, checked on chain, served by access tier.")

    @app.get("/health")
    async def health() -> dict[str, str]:
        await store().redis.ping()
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.put("/nodes", response_model=DiscoveredNode)
    async def upload(metadata: NodeMetadata, signer: str = Depends(signed)) -> DiscoveredNode:
        if signer != metadata.node_address:
            uploads.labels("wrong_signer").inc()
            raise HTTPException(403, f"metadata for {metadata.node_address} must be signed by that node's "
                                     f"key; it was signed by {signer}")
        try:
            flags = await run_in_threadpool(
                admit, chain_view(), metadata,
                require_whitelisted=settings.require_whitelisted_provider, pool_id=settings.pool_id,
            )
        except Refused as exc:
            uploads.labels("refused").inc()
            raise HTTPException(exc.status, exc.reason) from None
        others = await store().others_at_ip(metadata.ip_address, metadata.node_address)
        if len(others) >= settings.max_nodes_per_ip:
            uploads.labels("ip_limit").inc()
            raise HTTPException(409, f"IP {metadata.ip_address} already has {len(others)} nodes "
                                     f"(limit {settings.max_nodes_per_ip})")
        previous = await store().get(metadata.node_address)
        now = datetime.now(UTC)
        record = DiscoveredNode(metadata=metadata, on_chain=flags,
                                first_seen=previous.first_seen if previous else now, last_updated=now)
        await store().put(record, previous)
        uploads.labels("accepted").inc()
        return record

    @app.get("/pools/{pool_id}/nodes", response_model=list[DiscoveredNode])
    async def pool_nodes(pool_id: int, who: Caller = Depends(caller)) -> list[DiscoveredNode]:
        pool = await run_in_threadpool(chain_view().pool, pool_id)
        if pool is None:
            raise HTTPException(404, f"pool {pool_id} does not exist on chain")
        if not who.admin and who.address != pool.manager and not await is_validator(who.address or ""):
            raise HTTPException(403, f"{who.address} is neither pool {pool_id}'s manager nor a validator")
        requirements = parse_pool_requirements(pool.data_uri)

        def eligible(record: DiscoveredNode) -> bool:
            flags = record.on_chain
            if flags.pool_id == pool_id:
                return True
            if flags.pool_id is not None or not flags.registered or flags.blacklisted:
                return False
            if settings.require_whitelisted_provider and not flags.provider_whitelisted:
                return False
            return not requirements.mismatches(record.metadata.compute_specs)

        return [r for r in await store().all() if eligible(r)]

    @app.get("/nodes", response_model=list[DiscoveredNode])
    async def all_nodes(who: Caller = Depends(caller)) -> list[DiscoveredNode]:
        if not who.admin and not await is_validator(who.address or ""):
            raise HTTPException(403, "only validators and the admin may list every node")
        return await store().all()

    @app.get("/nodes/{address}", response_model=DiscoveredNode)
    async def one_node(address: str, who: Caller = Depends(caller)) -> DiscoveredNode:
        if not is_address(address):
            raise HTTPException(400, f"{address} is not an Ethereum address")
        address = to_checksum_address(address)
        record = await store().get(address)
        allowed = who.admin or who.address == address
        if not allowed and record and record.on_chain.pool_id is not None:
            pool = await run_in_threadpool(chain_view().pool, record.on_chain.pool_id)
            allowed = pool is not None and pool.manager == who.address
        if not allowed:
            allowed = await is_validator(who.address or "")
        if not allowed:
            raise HTTPException(403, "only the node, its pool's manager, validators and the admin may read "
                                     "a node's record")
        if record is None:
            raise HTTPException(404, f"no metadata for node {address}")
        return record

    return app
