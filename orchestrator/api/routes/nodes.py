"""`/nodes` (admin): what the orchestrator knows of each node, SQL record plus live Redis details.

The helpers here (`checked_address`, `node_row`, `full_record`) are shared with the node actions in
`admin.py`: both answer 400 for a malformed address and 404 for a node never seen.
"""

from __future__ import annotations

from datetime import UTC, datetime

from eth_utils import is_address, to_checksum_address
from fastapi import APIRouter, HTTPException
from fastapi.concurrency import run_in_threadpool

from intellect.wire.admin import HardwareFigures, HardwareHistory, NodeList, NodeRecord
from intellect.wire.nodes import NodeState
from orchestrator.api.deps import ADMIN_ONLY, ContextDep
from orchestrator.context import Context
from orchestrator.models import NodeRow, utcnow
from orchestrator.store.hardware import ProofRecord
from orchestrator.store.nodes import to_record

router = APIRouter(tags=["nodes"], dependencies=ADMIN_ONLY)


def checked_address(address: str) -> str:
    if not is_address(address):
        raise HTTPException(400, f"{address} is not an Ethereum address")
    return to_checksum_address(address)


async def node_row(ctx: Context, address: str) -> NodeRow:
    row = await run_in_threadpool(ctx.book.get, checked_address(address))
    if row is None:
        raise HTTPException(404, f"node {address} is not known to this orchestrator")
    return row


def figures(proof: ProofRecord) -> HardwareFigures:
    return HardwareFigures(outcome=proof.outcome, at=proof.at or utcnow(), n=proof.n,
                           precision=proof.precision, flops=proof.flops, rtt_ms=proof.rtt_ms,
                           seconds=proof.seconds, reasons=list(proof.reasons))  # fmt: skip


async def full_record(ctx: Context, row: NodeRow, proof: ProofRecord | None = None) -> NodeRecord:
    """The SQL record with what only Redis holds: reported task, metrics, version, last heartbeat
    (SQL keeps the heartbeat time only on state changes, so the live value wins), and its latest
    hardware challenge."""
    record = to_record(row)
    if proof is None:
        proof = (await run_in_threadpool(ctx.hardware.latest, [row.address])).get(row.address)
    task, metrics, version = await ctx.live.heartbeat_details(row.address)
    seen = (await ctx.live.last_seen([row.address])).get(row.address)
    update: dict[str, object] = {"task": task, "metrics": metrics, "worker_version": version,
                                 "hardware": figures(proof) if proof else None}  # fmt: skip
    if seen:
        update["last_heartbeat_at"] = datetime.fromtimestamp(seen, UTC)
    return record.model_copy(update=update)


@router.get("/nodes", response_model=NodeList)
async def list_nodes(ctx: ContextDep, state: NodeState | None = None) -> NodeList:
    rows = await run_in_threadpool(ctx.book.all, [state] if state else None)
    counts = await run_in_threadpool(ctx.book.counts)
    proofs = await run_in_threadpool(ctx.hardware.latest)
    return NodeList(counts=counts, nodes=[await full_record(ctx, r, proofs.get(r.address)) for r in rows])


@router.get("/nodes/{address}", response_model=NodeRecord)
async def get_node(address: str, ctx: ContextDep) -> NodeRecord:
    return await full_record(ctx, await node_row(ctx, address))


@router.get("/nodes/{address}/hardware", response_model=HardwareHistory)
async def node_hardware(address: str, ctx: ContextDep) -> HardwareHistory:
    """The node's hardware challenges, newest first, with the signed evidence of every wrong answer."""
    row = await node_row(ctx, address)
    proofs = await run_in_threadpool(ctx.hardware.history, row.address)
    links = await run_in_threadpool(ctx.round_trips.of, row.address)
    return HardwareHistory(node_address=row.address, proofs=[figures(p) for p in proofs],
                           evidence=[p.evidence for p in proofs if p.evidence],
                           round_trips={a: round(ms, 3) for a, ms in sorted(links.items())})  # fmt: skip


@router.get("/nodes/{address}/metrics", response_model=dict[str, float])
async def node_metrics(address: str, ctx: ContextDep) -> dict[str, float]:
    row = await node_row(ctx, address)
    return (await ctx.live.heartbeat_details(row.address))[1]
