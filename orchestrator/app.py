"""The orchestrator HTTP service: `create_app(settings)` (routes in docs/orchestrator.md)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import uuid
from collections.abc import AsyncIterator

import structlog
from eth_utils import is_address, to_checksum_address
from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.asyncio import Redis
from sqlalchemy import select

from intellect.auth import AdminToken, load_or_create_admin_token
from intellect.identity import Wallet
from intellect.redis_server import EmbeddedRedis
from intellect.wire.admin import NodeActionResult, NodeList, NodeLogs, NodeRecord
from intellect.wire.heartbeat import HeartbeatRequest, HeartbeatResponse
from intellect.wire.nodes import NodeState
from intellect.wire.tasks import Task, TaskSpec
from orchestrator.chain import LedgerPoolChain, PoolChain
from orchestrator.clients import PeerError, SignedClient
from orchestrator.context import Context, Metrics
from orchestrator.db import make_engine, migrate, session_factory
from orchestrator.groups.reconcile import UnknownTopology, resolve_topology
from orchestrator.groups.scheduler import GroupKeeper, GroupScheduler
from orchestrator.heartbeat import HeartbeatHandler, heartbeat_route
from orchestrator.invites import invite_loop
from orchestrator.live import LeaderLease, LiveStore
from orchestrator.models import NodeRow, TaskRow, utcnow
from orchestrator.monitor import monitor_loop
from orchestrator.nodes import NodeBook, audit, to_record
from orchestrator.scheduling import PlanCache, Scheduler, task_from_row
from orchestrator.settings import OrchestratorSettings
from orchestrator.storage import LocalDiskStorage, storage_router
from orchestrator.uploads import UploadService, make_storage

log = structlog.get_logger("intellect.orchestrator")


def load_manager(settings: OrchestratorSettings) -> Wallet:
    if settings.manager_key is not None:
        return Wallet.from_key(settings.manager_key.get_secret_value())
    if settings.manager_keystore is not None:
        return Wallet.load(settings.manager_keystore)
    raise SystemExit("no pool manager key: set INTELLECT_ORCH_MANAGER_KEY or --manager-keystore")


def ledger_pool_chain(settings: OrchestratorSettings, manager: Wallet) -> PoolChain:
    from ledger.client import LedgerClient

    client = LedgerClient(settings.rpc_url, settings.deployment, manager)
    return LedgerPoolChain(client, settings.pool_id, manager)


def create_app(settings: OrchestratorSettings, *, manager: Wallet | None = None,
               chain: PoolChain | None = None, scheduler: Scheduler | None = None) -> FastAPI:
    """Build the app; `manager`/`chain` default to the configured key and a LedgerClient."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    admin = AdminToken(load_or_create_admin_token(settings.admin_token_file))
    holder: dict[str, Context] = {}
    handler_box: dict[str, HeartbeatHandler] = {}
    keeper_box: dict[str, GroupKeeper] = {}
    storage = make_storage(settings)
    uploads = UploadService(settings, storage, lambda: holder["ctx"], admin)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.effective_database_url)
        await run_in_threadpool(migrate, engine)
        embedded = None
        url = settings.redis_url
        if url is None:
            embedded = EmbeddedRedis(data_dir=settings.state_dir / "redis").start()
            url = embedded.url
        redis = Redis.from_url(url)
        key = manager or load_manager(settings)
        pool_chain = chain or await run_in_threadpool(ledger_pool_chain, settings, key)
        sessions = session_factory(engine)
        live = LiveStore(redis, settings.pool_id, settings.heartbeat_ttl_seconds)
        ctx = Context(settings=settings, redis=redis, sessions=sessions, live=live,
                      book=NodeBook(sessions, live), plans=PlanCache(scheduler or GroupScheduler(), sessions),
                      chain=pool_chain, peers=SignedClient(key, settings.http_timeout_seconds,
                                                           settings.http_retries),
                      metrics=Metrics())
        holder["ctx"] = ctx
        handler_box["hb"] = HeartbeatHandler(ctx)
        keeper_box["groups"] = GroupKeeper(sessions, settings.topology_configs, live.bump_version,
                                           settings.effective_groups_interval)
        await ctx.book.rebuild_mirror()
        await live.bump_version()  # every replica reloads its plan from SQL
        lease = LeaderLease(redis, live.leader_key, secrets.token_hex(8),
                            3 * max(settings.check_interval_seconds, settings.invite_interval_seconds))
        loops = []
        if settings.run_background_loops:
            loops = [asyncio.create_task(invite_loop(ctx, lease.hold)),
                     asyncio.create_task(monitor_loop(ctx, lease.hold)),
                     asyncio.create_task(keeper_box["groups"].loop(lease.hold))]
        log.info("orchestrator started", pool=settings.pool_id, manager=key.address,
                 database=settings.effective_database_url.split("@")[-1], redis=url)
        try:
            yield
        finally:
            for loop in loops:
                loop.cancel()
            for loop in loops:
                with contextlib.suppress(asyncio.CancelledError):
                    await loop
            with contextlib.suppress(Exception):
                await lease.release()
            await ctx.peers.aclose()
            await redis.aclose()
            engine.dispose()
            if embedded:
                embedded.stop()

    def ctx() -> Context:
        return holder["ctx"]

    app = FastAPI(title="Intellect orchestrator", version="0.1.0", lifespan=lifespan,
                  description="Node lifecycle (invites, heartbeats, liveness) and the task API of one pool.")
    admin_only = [Depends(admin)]
    app.include_router(uploads.router())
    if isinstance(storage, LocalDiskStorage):  # embedded default: this service serves the signed URLs
        app.include_router(storage_router(storage, uploads.on_complete))

    def groups_changed() -> None:
        if "groups" in keeper_box:
            keeper_box["groups"].poke()

    @app.get("/health")
    async def health() -> dict[str, object]:
        await ctx().redis.ping()
        return {"status": "ok", "pool_id": settings.pool_id}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(ctx().metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/heartbeat", response_model=HeartbeatResponse,
              openapi_extra={"requestBody": {"content": {"application/json": {
                  "schema": HeartbeatRequest.model_json_schema()}}, "required": True}},
              description="Signed by the node key (X-Intellect-* headers); the reply carries its task.")
    async def heartbeat(request: Request) -> HeartbeatResponse:
        return await handler_box["hb"].handle(request)

    # Served by a raw ASGI route placed first (skips routing and dependency solving, ~18% of the
    # path's CPU); the FastAPI route above stays for the OpenAPI document.
    app.router.routes.insert(0, heartbeat_route(lambda: handler_box["hb"]))

    # ---- tasks ----

    @app.post("/tasks", response_model=Task, status_code=status.HTTP_201_CREATED, dependencies=admin_only)
    async def create_task(spec: TaskSpec) -> Task:
        configured = settings.topology_configs()
        for name in spec.allowed_topologies:
            try:
                resolve_topology(name, configured)
            except UnknownTopology as exc:
                raise HTTPException(422, f"scheduling_config.plugins.node_groups.allowed_topologies: {exc}") \
                    from None

        def insert() -> TaskRow:
            with ctx().sessions() as session, session.begin():
                row = TaskRow(id=str(uuid.uuid4()), name=spec.name, spec=spec.model_dump(mode="json"),
                              config_hash=spec.config_hash(), created_at=utcnow())
                session.add(row)
                audit(session, "admin", "task_created", row.id, name=spec.name)
                return row

        row = await run_in_threadpool(insert)
        await ctx().live.bump_version()
        groups_changed()
        return task_from_row(row)

    @app.get("/tasks", response_model=list[Task], dependencies=admin_only)
    async def list_tasks(include_deleted: bool = False) -> list[Task]:
        def load() -> list[TaskRow]:
            with ctx().sessions() as session:
                query = select(TaskRow).order_by(TaskRow.created_at)
                if not include_deleted:
                    query = query.where(TaskRow.deleted_at.is_(None))
                return list(session.scalars(query))

        return [task_from_row(r) for r in await run_in_threadpool(load)]

    def load_task(task_id: str) -> TaskRow:
        with ctx().sessions() as session:
            row = session.get(TaskRow, task_id)
        if row is None:
            raise HTTPException(404, f"no task {task_id}")
        return row

    @app.get("/tasks/{task_id}", response_model=Task, dependencies=admin_only)
    async def get_task(task_id: str) -> Task:
        return task_from_row(await run_in_threadpool(load_task, task_id))

    @app.delete("/tasks/{task_id}", response_model=Task, dependencies=admin_only)
    async def delete_task(task_id: str) -> Task:
        def mark() -> TaskRow:
            with ctx().sessions() as session, session.begin():
                row = session.get(TaskRow, task_id)
                if row is None:
                    raise HTTPException(404, f"no task {task_id}")
                if row.deleted_at is None:
                    row.deleted_at = utcnow()
                    audit(session, "admin", "task_deleted", task_id)
                return row

        row = await run_in_threadpool(mark)
        await ctx().live.bump_version()
        groups_changed()
        return task_from_row(row)

    # ---- nodes ----

    async def full_record(row: NodeRow) -> NodeRecord:
        record = to_record(row)
        task, metrics_, version = await ctx().live.heartbeat_details(row.address)
        seen = (await ctx().live.last_seen([row.address])).get(row.address)
        update: dict[str, object] = {"task": task, "metrics": metrics_, "worker_version": version}
        if seen:
            from datetime import UTC, datetime

            update["last_heartbeat_at"] = datetime.fromtimestamp(seen, UTC)
        return record.model_copy(update=update)

    def checked(address: str) -> str:
        if not is_address(address):
            raise HTTPException(400, f"{address} is not an Ethereum address")
        return to_checksum_address(address)

    async def node_row(address: str) -> NodeRow:
        row = await run_in_threadpool(ctx().book.get, checked(address))
        if row is None:
            raise HTTPException(404, f"node {address} is not known to this orchestrator")
        return row

    def worker_url(row: NodeRow) -> str:
        if not row.worker_url:
            raise HTTPException(409, f"node {row.address} has no worker address in discovery yet")
        return row.worker_url

    @app.get("/nodes", response_model=NodeList, dependencies=admin_only)
    async def list_nodes(state: NodeState | None = None) -> NodeList:
        rows = await run_in_threadpool(ctx().book.all, [state] if state else None)
        counts = await run_in_threadpool(ctx().book.counts)
        return NodeList(counts=counts, nodes=[await full_record(r) for r in rows])

    @app.get("/nodes/{address}", response_model=NodeRecord, dependencies=admin_only)
    async def get_node(address: str) -> NodeRecord:
        return await full_record(await node_row(address))

    @app.get("/nodes/{address}/metrics", response_model=dict[str, float], dependencies=admin_only)
    async def node_metrics(address: str) -> dict[str, float]:
        row = await node_row(address)
        return (await ctx().live.heartbeat_details(row.address))[1]

    @app.get("/nodes/{address}/logs", response_model=NodeLogs, dependencies=admin_only)
    async def node_logs(address: str, tail: int = Query(100, ge=0, le=10_000)) -> NodeLogs:
        row = await node_row(address)
        try:
            lines = await ctx().peers.logs(worker_url(row), tail)
        except PeerError as exc:
            raise HTTPException(502, f"worker did not give its logs: {exc.reason}") from None
        return NodeLogs(node_address=row.address, lines=lines)

    @app.post("/nodes/{address}/restart", response_model=NodeActionResult, dependencies=admin_only)
    async def node_restart(address: str) -> NodeActionResult:
        row = await node_row(address)
        try:
            reply = await ctx().peers.restart(worker_url(row))
        except PeerError as exc:
            raise HTTPException(502, f"worker did not restart: {exc.reason}") from None
        return NodeActionResult(node_address=row.address, ok=bool(reply.get("restarted", True)),
                                detail=str(reply.get("detail") or "") or None)

    @app.post("/nodes/{address}/ban", response_model=NodeActionResult, dependencies=admin_only)
    async def node_ban(address: str) -> NodeActionResult:
        row = await node_row(address)
        try:
            tx = await run_in_threadpool(ctx().chain.blacklist, row.address)
        except Exception as exc:
            raise HTTPException(502, f"blacklisting on chain failed: {exc}") from None
        await ctx().book.transition(row.address, NodeState.BANNED, "banned by the admin", actor="admin",
                                    in_pool=False)
        await ctx().live.forget_seen(row.address)
        return NodeActionResult(node_address=row.address, ok=True, tx_hash=tx, detail="blacklisted on chain")

    return app
