"""`POST /heartbeat`, signed by the node key: liveness in, the node's current task out.

Two routes share the path. `fast_route` (raw ASGI, placed first by the server) serves every request:
it skips FastAPI's routing and dependency solving, which was ~18% of the path's CPU. The FastAPI
route below is never reached in a full app; it stays so the OpenAPI document shows the request schema,
and so the router alone (without the fast route) still answers in a test.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from intellect.wire.heartbeat import HeartbeatRequest, HeartbeatResponse
from orchestrator.api.deps import HeartbeatDep
from orchestrator.heartbeat import heartbeat_route

router = APIRouter(tags=["heartbeat"])

# Reads the handler from `request.app.state.heartbeat`, so this one object serves any app.
fast_route = heartbeat_route()

_SCHEMA = {"requestBody": {"content": {"application/json": {"schema": HeartbeatRequest.model_json_schema()}},
                           "required": True}}


@router.post("/heartbeat", response_model=HeartbeatResponse, openapi_extra=_SCHEMA,
             description="Signed by the node key (X-Intellect-* headers); the reply carries its task.")
async def heartbeat(request: Request, handler: HeartbeatDep) -> Response:
    return await handler.handle(request)
