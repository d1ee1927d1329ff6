"""The heartbeat hot path: verify the signature, then one atomic Redis round trip, then the cached plan.

Per heartbeat: an ECDSA recovery through libsecp256k1 (the identity is the recovered address, never a
body field), one Lua script that claims the nonce, counts the rate, reads the node's state and the task
version and writes liveness (`LiveStore.record_beat`), and the task from the in-memory Plan. SQL is
touched only when something changes (first heartbeat after an invite: `NodeBook`; a new reported task
state: `AssignmentStore`, in a thread, off the reply's path).
The reply is built as bytes here: FastAPI's response_model pass would validate it a second time.

The route is `orchestrator/api/routes/heartbeat.py`, served ahead of the middleware stack
(`orchestrator/api/hot_path.py`). Errors are raised as HTTPException / RequestValidationError, so the
app's exception handlers shape them as for any route.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Coroutine
from typing import Any

import structlog
from fastapi import HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from intellect.auth import raw_path_with_query
from intellect.http_guard import JsonDepth
from intellect.signing import SignatureRejected, verify_signed_request
from intellect.wire.heartbeat import HeartbeatRequest, HeartbeatResponse
from intellect.wire.nodes import NodeState
from orchestrator.context import Context
from orchestrator.models import utcnow
from orchestrator.scheduling import Plan

log = structlog.get_logger("intellect.orchestrator.heartbeat")
MAX_BODY_BYTES = 64 * 1024  # a heartbeat is a few hundred bytes; metrics maps are capped by this


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body, bounded in size and in JSON nesting before anything parses it (as the app's guard
    does for every other route: the heartbeat route is served before the guard)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"heartbeat body over {limit} bytes")
    chunks, size = [], 0
    depth = JsonDepth()
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"heartbeat body over {limit} bytes")
        if not depth.feed(chunk):
            raise HTTPException(400, f"JSON body nested deeper than {depth.limit} levels")
        chunks.append(chunk)
    return b"".join(chunks)


class HeartbeatHandler:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._background: set[asyncio.Task[None]] = set()
        # Serialized replies per plan: with one task for all nodes this is a single entry.
        self._reply_plan: Plan | None = None
        self._replies: dict[int, tuple[object, bytes]] = {}

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def handle(self, request: Request) -> Response:
        started = time.perf_counter()
        result = "error"
        try:
            response = await self._handle(request)
            result = "ok"
            return response
        except HTTPException as exc:
            result = str(exc.status_code)
            raise
        except RequestValidationError:
            result = "422"
            raise
        finally:
            self.ctx.metrics.heartbeats.labels(result).inc()
            self.ctx.metrics.heartbeat_seconds.observe(time.perf_counter() - started)

    def _reply(self, plan: Plan, address: str) -> bytes:
        assigned = plan.task_for(address)
        if plan is not self._reply_plan:
            self._reply_plan, self._replies = plan, {}
        hit = self._replies.get(id(assigned))
        if hit is not None and hit[0] is assigned:
            return hit[1]
        body = HeartbeatResponse(current_task=assigned,
                                 interval_seconds=self.ctx.settings.heartbeat_interval_seconds).model_dump_json()
        if len(self._replies) < 20_000:  # plans that build a fresh object per call would only churn
            self._replies[id(assigned)] = (assigned, body.encode())
        return body.encode()

    async def _handle(self, request: Request) -> Response:
        ctx, s, live = self.ctx, self.ctx.settings, self.ctx.live
        body = await read_body(request)
        try:
            signed = verify_signed_request(request.method, raw_path_with_query(request), body,
                                           request.headers, max_skew_seconds=s.max_skew_seconds)
        except SignatureRejected as exc:
            raise HTTPException(exc.status, exc.reason) from None
        try:
            beat = HeartbeatRequest.model_validate_json(body)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False)) from None
        address = signed.address
        task_json = beat.task.model_dump_json() if beat.task else ""
        found = await live.record_beat(
            address, signed.nonce, nonce_ttl=2 * s.max_skew_seconds + 1,
            rate_limit=s.heartbeat_rate_limit_per_minute, now=time.time(), task_json=task_json,
            metrics_json=json.dumps(beat.metrics), worker_version=beat.worker_version or "")
        if found.outcome == "replayed":
            raise HTTPException(401, "nonce already used (replayed request)")
        if found.outcome == "rate_limited":
            raise HTTPException(429, f"more than {s.heartbeat_rate_limit_per_minute} heartbeats a minute")
        if found.outcome == "unknown":
            raise HTTPException(404, f"node {address} is not known to this orchestrator (pool {s.pool_id}): "
                                     "wait for an invite")
        if found.state == NodeState.BANNED:
            raise HTTPException(403, f"node {address} is banned from pool {s.pool_id}")
        if found.state == NodeState.EJECTED:
            raise HTTPException(403, f"node {address} was ejected from pool {s.pool_id}; "
                                     "it will be invited again once it is back in discovery")
        if beat.task and task_json.encode() != found.previous_task:
            self._spawn(run_in_threadpool(ctx.assignments.record, address, beat.task))
        if beat.leaving:
            await ctx.book.transition(address, NodeState.DEAD, "worker is shutting down", actor=address)
            await live.forget_seen(address)
            reply = HeartbeatResponse(current_task=None, interval_seconds=s.heartbeat_interval_seconds)
            return Response(reply.model_dump_json(), media_type="application/json")
        # Unhealthy → Healthy is left to the liveness check, which reads the same Redis liveness at its
        # next pass: after a stall, thousands of late nodes must not each cost an SQL write here.
        if found.state not in (NodeState.HEALTHY, NodeState.UNHEALTHY):  # first beat after an invite,
            await ctx.book.transition(address, NodeState.HEALTHY, None, actor=address,  # or back from Dead
                                      last_heartbeat_at=utcnow())
        plan = await ctx.plans.current(found.version)
        return Response(self._reply(plan, address), media_type="application/json")
