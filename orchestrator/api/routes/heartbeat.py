"""`POST /heartbeat`, signed by the node key: liveness in, the node's current task out.

In the served app `OrchestratorApp` (orchestrator/heartbeat.py) answers every `POST /heartbeat`
before the middleware stack and the router, so this route is never reached there; it stays so the
OpenAPI document shows the request schema, and so the router alone still answers in a test.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from intellect.wire.heartbeat import HeartbeatRequest, HeartbeatResponse
from orchestrator.api.deps import HeartbeatDep

router = APIRouter(tags=["heartbeat"])


_SCHEMA = {"requestBody": {"content": {"application/json": {"schema": HeartbeatRequest.model_json_schema()}},
                           "required": True}}


@router.post("/heartbeat", response_model=HeartbeatResponse, openapi_extra=_SCHEMA,
             description="Signed by the node key (X-Intellect-* headers); the reply carries its task.")
async def heartbeat(request: Request, handler: HeartbeatDep) -> Response:
    return await handler.handle(request)
