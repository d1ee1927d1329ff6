"""Invite loop: poll discovery for the pool's nodes, reconcile with the pool on chain, invite the new ones.

The rows are reconciled by the node store (`NodeBook.reconcile`): a node in the pool on chain but
unknown here (e.g. after a restart with a fresh database) is recorded and invited again; the worker,
already a member, answers by heartbeating to us. A failed invite is
retried with exponential back-off; a node that reappears in discovery after being ejected is re-invited.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

import structlog
from fastapi.concurrency import run_in_threadpool

from intellect.errors import PeerError, PeerUnreachable
from intellect.wire.invites import InviteRequest, nonce_hex
from intellect.wire.nodes import NodeState
from orchestrator.context import Context
from orchestrator.hardware.challenger import challenge_node
from orchestrator.models import NodeRow, utcnow
from orchestrator.pacing import Pacing
from orchestrator.store.hardware import FAILED, MAX_FAILED, WRONG

log = structlog.get_logger("intellect.orchestrator.invites")
MAX_CONCURRENT_INVITES = 16


async def invite_one(ctx: Context, row: NodeRow) -> None:
    settings = ctx.settings
    if await run_in_threadpool(ctx.chain.is_blacklisted, row.address):
        # Slashed for invalid work (or banned by the owner): the chain would refuse its join anyway.
        await ctx.book.transition(row.address, NodeState.BANNED, "blacklisted in the pool on chain",
                                  actor="invites", only_from=NodeState(row.state))
        return
    if settings.hardware_challenge and row.worker_url and not await hardware_passes(ctx, row):
        return
    invite = await run_in_threadpool(ctx.chain.invite, row.address, settings.invite_valid_seconds)
    request = InviteRequest(
        domain_id=invite.domain_id, pool_id=invite.pool_id, node_address=row.address,
        nonce=nonce_hex(invite.nonce), expiration=invite.expiration,
        signature=invite.signature, orchestrator_url=settings.effective_public_url,
    )
    via, why = "push", "invited"
    try:
        reply = await ctx.peers.invite(row.worker_url or "", request)
        error = None if reply.accepted else f"worker declined the invite: {reply.detail}"
    except PeerUnreachable as exc:
        # Nobody can call this node (behind NAT, no open port): leave the invite at discovery, where
        # the node, which polls discovery anyway, fetches it and joins by itself.
        try:
            await ctx.peers.leave_invite(settings.discovery_url, request)
            error, via = None, "pull"
            why = f"invite left at discovery (its API is unreachable: {exc.detail[:200]})"
        except PeerError as mailbox:
            error = f"{exc}; and discovery refused the invite: {mailbox}"
    except PeerError as exc:
        error = str(exc)
    if error is None:
        ctx.metrics.invites.labels("accepted" if via == "push" else "left").inc()
        await ctx.book.transition(row.address, NodeState.WAITING_FOR_HEARTBEAT, why, actor="invites",
                                  only_from=NodeState(row.state), joined_via=via,
                                  invited_at=utcnow(), invite_attempts=0, next_invite_at=None)
        return
    ctx.metrics.invites.labels("failed").inc()
    attempts = row.invite_attempts + 1
    backoff = min(settings.invite_interval_seconds * 2 ** (attempts - 1), settings.invite_max_backoff_seconds)
    log.warning("invite failed", node=row.address, attempt=attempts, error=error, retry_in=backoff)
    await ctx.book.transition(row.address, NodeState.DISCOVERED, f"invite failed: {error}", actor="invites",
                              invite_attempts=attempts, next_invite_at=utcnow() + timedelta(seconds=backoff))


async def hardware_passes(ctx: Context, row: NodeRow) -> bool:
    """Challenge the node's hardware before its invite (docs/hardware.md). A wrong answer, or a signed
    commitment not opened, is refused the invite (retried with the invite back-off, with a fresh
    challenge) until `MAX_FAILED` such failures are on record: then the node is Banned here (off chain)
    and never challenged nor invited again, so a liar that declines the openings it cannot answer tries
    its luck a bounded number of times. An unanswered challenge (unreachable, e.g. behind NAT, or too
    slow, before any commitment) proves nothing and costs nothing: the node is invited and placed
    after the nodes with a proven figure."""
    settings = ctx.settings
    if await run_in_threadpool(ctx.hardware.failed, row.address) >= MAX_FAILED:
        await _strike_out(ctx, row)
        return False
    proof = await challenge_node(ctx.peers, row.address, row.worker_url or "", settings.hardware_n,
                                 settings.hardware_precision, settings.hardware_timeout_seconds)  # fmt: skip
    await run_in_threadpool(ctx.hardware.record, proof)
    ctx.metrics.hardware.labels(proof.outcome).inc()
    if proof.outcome not in FAILED:
        return True
    if await run_in_threadpool(ctx.hardware.failed, row.address) >= MAX_FAILED:
        await _strike_out(ctx, row)
        return False
    attempts = row.invite_attempts + 1
    backoff = min(settings.invite_interval_seconds * 2 ** (attempts - 1), settings.invite_max_backoff_seconds)
    what = "answered wrongly" if proof.outcome == WRONG else "committed and not opened"
    await ctx.book.transition(row.address, NodeState.DISCOVERED,
                              f"hardware challenge {what}: {'; '.join(proof.reasons[:2])}"[:1000],
                              actor="hardware", only_from=NodeState(row.state), invite_attempts=attempts,
                              next_invite_at=utcnow() + timedelta(seconds=backoff))  # fmt: skip
    return False


async def _strike_out(ctx: Context, row: NodeRow) -> None:
    log.warning("hardware challenges failed too often: not invited again", node=row.address)
    await ctx.book.transition(row.address, NodeState.BANNED,
                              f"{MAX_FAILED} hardware challenges failed (wrong or not opened): not invited "
                              "again (off chain; the pool owner decides on chain)", actor="hardware",
                              only_from=NodeState(row.state))  # fmt: skip


# Every this many passes the whole Redis state mirror is rewritten from SQL (one pipelined write), in
# case a transition's mirror write was lost after its SQL commit; the other passes write only the
# entries their reconcile changed (one write per node per pass was most of the pass at 25,000 nodes).
FULL_MIRROR_EVERY = 30


async def invite_pass(ctx: Context, full_mirror: bool = True) -> None:
    try:
        records = await ctx.peers.pool_nodes(ctx.settings.discovery_url, ctx.settings.pool_id)
    except PeerError as exc:
        log.warning("discovery unavailable", error=str(exc))
        records = []
    on_chain = set(await run_in_threadpool(ctx.chain.pool_nodes))
    done = await run_in_threadpool(ctx.book.reconcile, records, on_chain)
    if full_mirror:
        await ctx.live.set_states(await run_in_threadpool(ctx.book.mirror_states))
    else:
        await ctx.live.set_states(done.mirror)
    now = utcnow()
    discovered = await run_in_threadpool(ctx.book.all, [NodeState.DISCOVERED])
    due = [r for r in discovered if r.worker_url and (r.next_invite_at is None or r.next_invite_at <= now)]
    limit = asyncio.Semaphore(MAX_CONCURRENT_INVITES)

    async def bounded(row: NodeRow) -> None:
        async with limit:
            await invite_one(ctx, row)

    await asyncio.gather(*(bounded(r) for r in due))


async def invite_loop(ctx: Context, is_leader: Callable[[], Awaitable[bool]]) -> None:
    pacing = Pacing("invite pass", ctx.settings.invite_interval_seconds)
    for count in itertools.count():
        started = time.monotonic()
        try:
            if await is_leader():
                await invite_pass(ctx, full_mirror=count % FULL_MIRROR_EVERY == 0)
            pacing.succeeded()
        except Exception:  # a flaky RPC or Redis must not end the loop
            pacing.failed()
        await asyncio.sleep(pacing.wait_after(started, time.monotonic()))
