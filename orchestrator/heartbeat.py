"""The heartbeat hot path: verify the signature, one Redis round trip to authorise, one to record.

Per heartbeat: an ECDSA recovery (the identity is the recovered address, never a body field), a
pipeline claiming the nonce + counting the rate + reading the node's state and the task version, a
pipeline writing liveness, and the task from the in-memory Plan. SQL is touched only when something
changes (first heartbeat after an invite, a new reported task state).
"""

from __future__ import annotations

import asyncio
import json
import time

import structlog
from fastapi import HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from intellect.auth import raw_path_with_query
from intellect.signing import SignatureRejected, verify_signed_request
from intellect.wire.heartbeat import HeartbeatRequest, HeartbeatResponse, TaskStatus
from intellect.wire.nodes import NodeState
from orchestrator.context import Context
from orchestrator.models import AssignmentRow, utcnow

log = structlog.get_logger("intellect.orchestrator.heartbeat")


def record_task_status(ctx: Context, address: str, status: TaskStatus) -> None:
    """Upsert the node's assignment row for the task it reports (called only when the report changes)."""
    from sqlalchemy import select

    with ctx.sessions() as session, session.begin():
        row = session.scalars(select(AssignmentRow).where(
            AssignmentRow.task_id == status.task_id, AssignmentRow.node_address == address)).first()
        if row is None:
            from orchestrator.models import TaskRow

            if session.get(TaskRow, status.task_id) is None:
                return  # a task this orchestrator never issued (or long purged): nothing to record
            row = AssignmentRow(task_id=status.task_id, node_address=address, assigned_at=utcnow())
            session.add(row)
        row.state, row.detail, row.updated_at = status.state.value, status.detail, utcnow()


class HeartbeatHandler:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._background: set[asyncio.Task[None]] = set()

    def _spawn(self, coro) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def handle(self, request: Request) -> HeartbeatResponse:
        started = time.perf_counter()
        result = "error"
        try:
            response = await self._handle(request)
            result = "ok"
            return response
        except HTTPException as exc:
            result = str(exc.status_code)
            raise
        finally:
            self.ctx.metrics.heartbeats.labels(result).inc()
            self.ctx.metrics.heartbeat_seconds.observe(time.perf_counter() - started)

    async def _handle(self, request: Request) -> HeartbeatResponse:
        ctx, s, live = self.ctx, self.ctx.settings, self.ctx.live
        body = await request.body()
        try:
            signed = verify_signed_request(request.method, raw_path_with_query(request), body,
                                           request.headers, max_skew_seconds=s.max_skew_seconds)
        except SignatureRejected as exc:
            raise HTTPException(exc.status, exc.reason) from None
        try:
            beat = HeartbeatRequest.model_validate_json(body)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False)) from None
        address, now = signed.address, time.time()
        rate_key = f"orch:rate:{address}:{int(now) // 60}"
        pipe = ctx.redis.pipeline(transaction=False)
        pipe.set(f"orch:nonce:{address}:{signed.nonce}", 1, nx=True, ex=2 * s.max_skew_seconds + 1)
        pipe.incr(rate_key)
        pipe.expire(rate_key, 120)
        pipe.hget(live.state_key, address)
        pipe.get(live.version_key)
        pipe.hget(live.hb_key(address), "task")
        claimed, count, _, raw_state, raw_version, previous_task = await pipe.execute()
        if not claimed:
            raise HTTPException(401, "nonce already used (replayed request)")
        if int(count) > s.heartbeat_rate_limit_per_minute:
            raise HTTPException(429, f"more than {s.heartbeat_rate_limit_per_minute} heartbeats a minute")
        if raw_state is None:
            raise HTTPException(404, f"node {address} is not known to this orchestrator (pool {s.pool_id}): "
                                     "wait for an invite")
        state = NodeState(raw_state.decode())
        if state == NodeState.BANNED:
            raise HTTPException(403, f"node {address} is banned from pool {s.pool_id}")
        if state == NodeState.EJECTED:
            raise HTTPException(403, f"node {address} was ejected from pool {s.pool_id}; "
                                     "it will be invited again once it is back in discovery")
        task_json = beat.task.model_dump_json() if beat.task else ""
        pipe = ctx.redis.pipeline(transaction=False)
        pipe.zadd(live.seen_key, {address: now})
        pipe.hset(live.hb_key(address), mapping={
            "task": task_json, "metrics": json.dumps(beat.metrics), "version": beat.worker_version or "",
        })
        pipe.expire(live.hb_key(address), int(s.heartbeat_ttl_seconds) + 1)
        await pipe.execute()
        if beat.task and task_json.encode() != (previous_task or b""):
            self._spawn(run_in_threadpool(record_task_status, ctx, address, beat.task))
        if beat.leaving:
            await ctx.book.transition(address, NodeState.DEAD, "worker is shutting down", actor=address)
            await live.forget_seen(address)
            return HeartbeatResponse(current_task=None, interval_seconds=s.heartbeat_interval_seconds)
        if state != NodeState.HEALTHY:  # rare: first heartbeat after an invite, or a node that came back
            await ctx.book.transition(address, NodeState.HEALTHY, None, actor=address,
                                      last_heartbeat_at=utcnow())
        plan = await ctx.plans.current(int(raw_version or 0))
        return HeartbeatResponse(current_task=plan.task_for(address),
                                 interval_seconds=s.heartbeat_interval_seconds)
