"""The orchestrator HTTP service: `create_app(settings)` assembles the app (routes in docs/orchestrator.md).

Why this shape: routes live in `orchestrator.api.routes` as module-level routers and read what they
need through `orchestrator.api.deps` from `app.state`; this module only decides what goes on
`app.state` and when. Objects that need nothing running (settings, admin access, storage, upload
service) are put there when the app is built; what needs the database, Redis and the chain (the
`Context`, the heartbeat handler, the group keeper) by the lifespan, which also runs the migrations,
starts the background loops under the leader lease and tears everything down in reverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import secrets
from collections.abc import AsyncIterator
from functools import partial

import structlog
from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from redis.asyncio import Redis
from redis.exceptions import RedisError
from requests.exceptions import ConnectionError as RequestsConnectionError

from intellect.auth import AdminToken, load_or_create_admin_token
from intellect.http_guard import guard
from intellect.identity import Wallet
from intellect.redis_server import redis_url_or_embedded
from orchestrator.access import AdminAccess
from orchestrator.api.hot_path import OrchestratorApp
from orchestrator.api.routes import admin, groups, health, heartbeat, nodes, storage, tasks
from orchestrator.chain import LedgerPoolChain, PoolChain
from orchestrator.clients import SignedClient
from orchestrator.context import Context, Metrics
from orchestrator.db import make_engine, migrate, session_factory
from orchestrator.groups.scheduler import GroupKeeper, GroupScheduler
from orchestrator.hardware.rechecks import recheck_loop
from orchestrator.hardware.round_trips import round_trip_loop
from orchestrator.heartbeat import HeartbeatHandler
from orchestrator.invites import invite_loop
from orchestrator.live import LeaderLease, LiveStore
from orchestrator.monitor import monitor_loop
from orchestrator.scheduling import PlanCache, Scheduler
from orchestrator.settings import OrchestratorSettings
from orchestrator.storage import LocalDiskStorage, storage_router
from orchestrator.store.assignments import AssignmentStore
from orchestrator.store.hardware import HardwareBook
from orchestrator.store.nodes import NodeBook
from orchestrator.store.round_trips import RoundTripBook
from orchestrator.store.tasks import TaskStore
from orchestrator.store.uploads import UploadStore
from orchestrator.uploads import UploadService, make_storage, storage_secret

log = structlog.get_logger("intellect.orchestrator")


def load_manager(settings: OrchestratorSettings) -> Wallet:
    if settings.manager_key is not None:
        return Wallet.from_key(settings.manager_key.get_secret_value())
    if settings.manager_keystore is not None:
        return Wallet.load(settings.manager_keystore)
    raise SystemExit("no pool manager key: set INTELLECT_ORCH_MANAGER_KEY or --manager-keystore")


def group_secret_key(settings: OrchestratorSettings) -> bytes:
    """The key node groups' secrets are derived from (`GroupScheduler`): a sub-key of the storage
    secret, which every replica shares, so the storage URL key itself never signs anything else."""
    return hmac.new(storage_secret(settings).encode(), b"group-secrets", hashlib.sha256).digest()


def ledger_pool_chain(settings: OrchestratorSettings, manager: Wallet) -> PoolChain:
    from ledger.client import LedgerClient

    client = LedgerClient(settings.rpc_url, settings.deployment, manager)
    return LedgerPoolChain(client, settings.pool_id, manager)


class TaskChanges:
    """What every task write sets off (`TaskStore.on_change`): the shared version counter moves so each
    replica rebuilds its plan, and this process's group keeper reconciles now instead of at its next
    period."""

    def __init__(self, live: LiveStore, keeper: GroupKeeper) -> None:
        self.live = live
        self.keeper = keeper

    async def __call__(self) -> None:
        await self.live.bump_version()
        self.keeper.poke()


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Database (migrated), Redis (embedded unless configured), chain, Context on `app.state`, loops.

    The build-time arguments of `create_app` (`manager`, `chain`, `scheduler`) are read back from
    `app.state`; `None` means the configured key, a LedgerClient and the group scheduler.
    """
    state = app.state
    settings: OrchestratorSettings = state.settings
    # Each resource is released however far the start got: a start that fails after the embedded
    # Redis came up (no manager key, chain unreachable) must not leave a redis-server behind.
    async with contextlib.AsyncExitStack() as resources:
        engine = make_engine(settings.effective_database_url)
        resources.callback(engine.dispose)
        await run_in_threadpool(migrate, engine)
        url, embedded = redis_url_or_embedded(settings.redis_url, settings.state_dir)
        if embedded:
            resources.callback(embedded.stop)
        redis = Redis.from_url(url)
        resources.push_async_callback(redis.aclose)
        key: Wallet = state.manager or load_manager(settings)
        state.admin.allow(key.address)
        pool_chain: PoolChain = state.chain or await run_in_threadpool(ledger_pool_chain, settings, key)
        sessions = session_factory(engine)
        live = LiveStore(redis, settings.pool_id, settings.heartbeat_ttl_seconds)
        resources.callback(live.close)
        keeper = GroupKeeper(sessions, settings.topology_configs, live.bump_version,
                             settings.effective_groups_interval, settings.group_failed_cooldown_seconds)
        scheduler = state.scheduler or GroupScheduler(state.group_key)
        ctx = Context(settings=settings, redis=redis, sessions=sessions, live=live,
                      book=NodeBook(sessions, live), tasks=TaskStore(sessions, TaskChanges(live, keeper)),
                      plans=PlanCache(scheduler, sessions), chain=pool_chain,
                      peers=SignedClient(key, settings.http_timeout_seconds, settings.http_retries),
                      metrics=Metrics(), hardware=HardwareBook(sessions),
                      round_trips=RoundTripBook(sessions), assignments=AssignmentStore(sessions),
                      uploads=UploadStore(sessions))
        resources.push_async_callback(ctx.peers.aclose)
        state.ctx = ctx
        state.heartbeat = HeartbeatHandler(ctx)
        state.groups = keeper
        await ctx.book.rebuild_mirror()
        await live.bump_version()  # every replica reloads its plan from SQL
        lease = LeaderLease(redis, live.leader_key, secrets.token_hex(8),
                            3 * max(settings.check_interval_seconds, settings.invite_interval_seconds))
        loops = []
        if settings.run_background_loops:
            loops = [asyncio.create_task(invite_loop(ctx, lease.hold), name="invites"),
                     asyncio.create_task(monitor_loop(ctx, lease.hold), name="liveness"),
                     asyncio.create_task(keeper.loop(lease.hold), name="groups")]
            if settings.hardware_challenge and settings.hardware_recheck_seconds > 0:
                loops.append(asyncio.create_task(recheck_loop(ctx, lease.hold), name="hardware"))
            if settings.round_trip_seconds > 0:
                loops.append(asyncio.create_task(round_trip_loop(ctx, lease.hold), name="round-trips"))
        log.info("orchestrator started", pool=settings.pool_id, manager=key.address,
                 database=settings.effective_database_url.split("@")[-1], redis=url)
        try:
            yield
        finally:
            for loop in loops:
                loop.cancel()
            # Bounded: a loop that does not end on cancel must not hold the shutdown (and the replica's
            # lease, Redis and database connections) forever; say which one it was.
            _, stuck = await asyncio.wait(loops, timeout=10) if loops else (set(), set())
            for loop in stuck:
                log.error("background loop ignored its cancellation", loop=loop.get_name())
            with contextlib.suppress(Exception):
                await lease.release()


def create_app(settings: OrchestratorSettings, *, manager: Wallet | None = None,
               chain: PoolChain | None = None, scheduler: Scheduler | None = None) -> FastAPI:
    """Build the app; `manager`/`chain` default to the configured key and a LedgerClient.

    Building writes the files made on first start (admin token, storage secret) and nothing else: the
    database, Redis and the loops start with the lifespan.
    """
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    app = OrchestratorApp(title="Intellect orchestrator", version="0.1.0", lifespan=lifespan,
                  description="Node lifecycle (invites, heartbeats, liveness) and the task API of one pool.")
    state = app.state
    state.settings = settings
    state.manager, state.chain, state.scheduler = manager, chain, scheduler
    state.admin = AdminAccess(AdminToken(load_or_create_admin_token(settings.admin_token_file)),
                              settings.admin_signers, max_skew_seconds=settings.max_skew_seconds)
    state.storage = make_storage(settings)
    state.group_key = group_secret_key(settings)
    # The storage callback has no request to read `app.state` from: it looks the Context up when called.
    state.uploads = UploadService(settings, state.storage, partial(getattr, state, "ctx"), state.admin)

    app.include_router(storage.router)
    if isinstance(state.storage, LocalDiskStorage):  # embedded default: this service serves the signed URLs
        app.include_router(storage_router(state.storage, state.uploads.on_complete))
    app.include_router(health.router)
    # POST /heartbeat is nearly all of a large pool's traffic: served ahead of the middleware stack.
    app.include_hot_router(heartbeat.router)
    for module in (tasks, nodes, groups, admin):
        app.include_router(module.router)

    # Bodies are limited while they stream (before auth and parsing); storage PUTs enforce their
    # own per-file limit; a dead Redis or chain answers 503/502 with a JSON reason.
    return guard(
        app, per_path={"/storage/objects/": None},
        unavailable=[(RedisError, 503, "redis"), (RequestsConnectionError, 502, "chain (RPC)")],
    )  # fmt: skip
