"""`POST /heartbeat`, signed by the node key: liveness in, the node's current task out.

The one heartbeat route. The server includes this router with `include_hot_router`, so the served app
calls `heartbeat` ahead of its middleware stack (orchestrator/api/hot_path.py says why and what the
endpoint does in the stack's place); mounted on a plain app (a test), it is an ordinary route. Hence
no FastAPI dependency: the handler is read from `app.state`, and the request schema is given by hand
(the handler reads the raw body itself, since the signature covers its bytes).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from intellect.wire.heartbeat import HeartbeatRequest, HeartbeatResponse
from orchestrator.api.deps import get_heartbeat_handler

router = APIRouter(tags=["heartbeat"])


_SCHEMA = {"requestBody": {"content": {"application/json": {"schema": HeartbeatRequest.model_json_schema()}},
                           "required": True}}


@router.post("/heartbeat", response_model=HeartbeatResponse, openapi_extra=_SCHEMA,
             description="Signed by the node key (X-Intellect-* headers); the reply carries its task.")
async def heartbeat(request: Request) -> Response:
    return await get_heartbeat_handler(request).handle(request)
