"""The worker's small HTTP API: `POST /invite`, `GET /logs`, `POST /restart`, `POST /hardware/challenge`,
`POST /hardware/reveal`, `POST /hardware/round-trips`, `GET /health`, `GET /metrics`.

Every route but `/health` and `/metrics` takes only requests signed (intellect.signing) by the pool's
manager key or, for logs and restart, by an address with the validator role; both read on chain. Invites must
come from the manager: the contract would refuse anything else anyway, and refusing early keeps
strangers from making the worker spend gas.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from eth_utils import to_checksum_address
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from pydantic import BaseModel

from intellect.auth import MemoryNonceStore, RequestVerifier
from intellect.http_guard import guard
from intellect.wire.hardware import (
    HardwareAnswer,
    HardwareChallenge,
    HardwareCommitment,
    HardwareReveal,
    RoundTripReport,
    RoundTripRequest,
)
from intellect.wire.invites import InviteRequest, InviteResponse
from worker import __version__
from worker.heartbeat import handshake_ms
from worker.proof import HardwareProver, UnknownChallenge
from worker.runtime.base import Runtime

Role = Literal["manager", "validator"]


class Authorizer(Protocol):
    def role_of(self, address: str) -> Role | None:
        """The caller's role for this worker's pool, or None for a stranger."""


class InviteRejected(Exception):
    def __init__(self, reason: str, status: int = 409) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class LogsResponse(BaseModel):
    node_address: str
    lines: list[str]


class RestartResponse(BaseModel):
    restarted: bool
    detail: str | None = None


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"
    node_address: str
    pool_id: int
    pool_joined: bool
    heartbeating: bool
    version: str = __version__


@dataclass
class ApiContext:
    node_address: str
    pool_id: int
    authorizer: Authorizer
    runtime: Runtime
    on_invite: Callable[[InviteRequest], InviteResponse]
    health: Callable[[], tuple[bool, bool]]  # (pool_joined, heartbeating)
    max_skew_seconds: int = 60
    prover: HardwareProver | None = None  # None: this worker answers no hardware challenge (404)


def get_ctx(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.ctx
    return ctx


async def _signed_role(request: Request, ctx: ApiContext) -> tuple[str, Role | None]:
    verifier: RequestVerifier = request.app.state.verifier
    caller = await verifier.dependency(request)
    return caller, await run_in_threadpool(ctx.authorizer.role_of, caller)


async def caller_role(request: Request, ctx: ApiContext = Depends(get_ctx)) -> tuple[str, Role]:
    """The signed caller and its role for this pool; 401 unsigned/replayed, 403 a stranger."""
    caller, role = await _signed_role(request, ctx)
    if role is None:
        raise HTTPException(403, f"{caller} is neither pool {ctx.pool_id}'s manager nor a validator")
    return caller, role


async def manager_only(request: Request, ctx: ApiContext = Depends(get_ctx)) -> str:
    """The signed caller if it is the pool's manager (the only one who may invite, or have this node
    open connections for it); else 401/403."""
    caller, role = await _signed_role(request, ctx)
    if role != "manager":
        what = "a validator" if role == "validator" else "not the manager"
        action = "invite" if request.url.path.endswith("/invite") else f"call {request.url.path}"
        raise HTTPException(403, f"only pool {ctx.pool_id}'s manager may {action}; {caller} is {what}")
    return caller


def invite_problem(invite: InviteRequest, pool_id: int, node_address: str) -> str | None:
    """Why this worker cannot take `invite` (another pool, another node, expired), or None. The same
    checks for an invite sent to the API and one fetched from discovery."""
    if invite.pool_id != pool_id:
        return f"invite is for pool {invite.pool_id}; this worker serves pool {pool_id}"
    if to_checksum_address(invite.node_address) != node_address:
        return f"invite is for node {invite.node_address}; this node is {node_address}"
    if invite.expiration <= int(time.time()):
        return "invite already expired"
    return None


health_router = APIRouter(tags=["health"])
invite_router = APIRouter(tags=["invite"])
task_router = APIRouter(tags=["task"])
hardware_router = APIRouter(prefix="/hardware", tags=["hardware"])


@health_router.get("/health", response_model=HealthResponse)
def health(ctx: ApiContext = Depends(get_ctx)) -> HealthResponse:
    joined, beating = ctx.health()
    return HealthResponse(node_address=ctx.node_address, pool_id=ctx.pool_id,
                          pool_joined=joined, heartbeating=beating)


@invite_router.post("/invite", response_model=InviteResponse)
async def invite(body: InviteRequest, _: str = Depends(manager_only),
                 ctx: ApiContext = Depends(get_ctx)) -> InviteResponse:
    problem = invite_problem(body, ctx.pool_id, ctx.node_address)
    if problem is not None:
        raise HTTPException(400, problem)
    try:
        return await run_in_threadpool(ctx.on_invite, body)
    except InviteRejected as exc:
        raise HTTPException(exc.status, exc.reason) from None


@task_router.get("/logs", response_model=LogsResponse)
async def logs(tail: int = Query(100, ge=0, le=10_000), _: tuple[str, Role] = Depends(caller_role),
               ctx: ApiContext = Depends(get_ctx)) -> LogsResponse:
    lines = await run_in_threadpool(ctx.runtime.logs, tail)
    return LogsResponse(node_address=ctx.node_address, lines=list(lines))


@task_router.post("/restart", response_model=RestartResponse)
async def restart(_: tuple[str, Role] = Depends(caller_role), ctx: ApiContext = Depends(get_ctx)
                  ) -> RestartResponse:
    status = await run_in_threadpool(ctx.runtime.restart)
    if status is None:
        return RestartResponse(restarted=False, detail="no task assigned: nothing to restart")
    shown = f"task {status.task_id} {status.state}" + (f": {status.detail}" if status.detail else "")
    return RestartResponse(restarted=True, detail=shown)


def get_prover(ctx: ApiContext = Depends(get_ctx)) -> HardwareProver:
    if ctx.prover is None:
        raise HTTPException(404, "this worker answers no hardware challenge")
    return ctx.prover


@hardware_router.post("/challenge", response_model=HardwareCommitment)
async def hardware_challenge(body: HardwareChallenge, _: tuple[str, Role] = Depends(caller_role),
                             prover: HardwareProver = Depends(get_prover)) -> HardwareCommitment:
    """Compute C = A·B of the challenge and commit to it (docs/hardware.md): the manager or a validator."""
    return await run_in_threadpool(prover.commit, body)


@hardware_router.post("/reveal", response_model=HardwareAnswer)
async def hardware_reveal(body: HardwareReveal, _: tuple[str, Role] = Depends(caller_role),
                          prover: HardwareProver = Depends(get_prover)) -> HardwareAnswer:
    """C·r and the probed rows with their Merkle proofs, once per challenge."""
    try:
        return await run_in_threadpool(prover.reveal, body)
    except UnknownChallenge as exc:
        raise HTTPException(409, str(exc)) from None


@hardware_router.post("/round-trips", response_model=RoundTripReport)
async def round_trips(body: RoundTripRequest, _: str = Depends(manager_only)) -> RoundTripReport:
    """The round trip from here to each named peer inbox (the shortest of 3 TCP handshakes, 2 s each):
    what the pool places groups by (docs/hardware.md). The manager only (it already decides what this
    node runs): anyone else could use the node to probe its own network; at most 16 peers."""
    return RoundTripReport(ms=list(await asyncio.gather(*(handshake_ms(p, timeout=2.0) for p in body.peers))))


@health_router.get("/metrics")
def metrics(ctx: ApiContext = Depends(get_ctx)) -> Response:
    # Prometheus text, read when scraped: pool membership, heartbeating, and the task's latest metrics
    # from the bridge (what the next heartbeat carries). A comment, not a docstring: no OpenAPI text.
    registry = CollectorRegistry()
    joined, beating = ctx.health()
    Gauge("worker_pool_joined", "1 when this node is in its pool", registry=registry).set(joined)
    Gauge("worker_heartbeating", "1 while heartbeats reach the orchestrator", registry=registry).set(beating)
    task = Gauge("worker_task_metric", "the running task's latest reported metrics", ["name"],
                 registry=registry)  # fmt: skip
    for name, value in ctx.runtime.metrics().items():
        task.labels(name).set(value)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def create_app(ctx: ApiContext) -> FastAPI:
    """The worker API over `ctx`; each resource is its own router, state comes in by dependencies."""
    app = FastAPI(title="Intellect worker", version=__version__)
    app.state.ctx = ctx
    app.state.verifier = RequestVerifier(MemoryNonceStore(), max_skew_seconds=ctx.max_skew_seconds)
    for router in (health_router, invite_router, task_router, hardware_router):
        app.include_router(router)
    return guard(app, max_body=64 * 1024)  # bodies refused while they stream, JSON errors
