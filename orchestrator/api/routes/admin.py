"""Admin actions on one node: logs and restart proxied to its worker (signed with the manager key),
and ban (blacklisted on chain, then state Banned). A failing worker or chain call is a 502 naming it."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query
from fastapi.concurrency import run_in_threadpool

from intellect.errors import PeerError
from intellect.wire.admin import NodeActionResult, NodeLogs
from intellect.wire.nodes import NodeState
from orchestrator.api.deps import ADMIN_ONLY, ContextDep
from orchestrator.api.routes.nodes import node_row
from orchestrator.models import NodeRow

router = APIRouter(tags=["admin"], dependencies=ADMIN_ONLY)


def worker_url(row: NodeRow) -> str:
    if not row.worker_url:
        raise HTTPException(409, f"node {row.address} has no worker address in discovery yet")
    return row.worker_url


@router.get("/nodes/{address}/logs", response_model=NodeLogs)
async def node_logs(address: str, ctx: ContextDep, tail: int = Query(100, ge=0, le=10_000)) -> NodeLogs:
    row = await node_row(ctx, address)
    try:
        lines = await ctx.peers.logs(worker_url(row), tail)
    except PeerError as exc:
        raise HTTPException(502, f"worker did not give its logs: {exc}") from None
    return NodeLogs(node_address=row.address, lines=lines)


@router.post("/nodes/{address}/restart", response_model=NodeActionResult)
async def node_restart(address: str, ctx: ContextDep) -> NodeActionResult:
    row = await node_row(ctx, address)
    try:
        reply = await ctx.peers.restart(worker_url(row))
    except PeerError as exc:
        raise HTTPException(502, f"worker did not restart: {exc}") from None
    return NodeActionResult(node_address=row.address, ok=bool(reply.get("restarted", True)),
                            detail=str(reply.get("detail") or "") or None)


@router.post("/nodes/{address}/ban", response_model=NodeActionResult)
async def node_ban(address: str, ctx: ContextDep) -> NodeActionResult:
    row = await node_row(ctx, address)
    try:
        tx = await run_in_threadpool(ctx.chain.blacklist, row.address)
    except Exception as exc:
        raise HTTPException(502, f"blacklisting on chain failed: {exc}") from None
    await ctx.book.transition(row.address, NodeState.BANNED, "banned by the admin", actor="admin",
                              in_pool=False)
    await ctx.live.forget_seen(row.address)
    return NodeActionResult(node_address=row.address, ok=True, tx_hash=tx, detail="blacklisted on chain")
