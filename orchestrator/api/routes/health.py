"""`GET /health` and `GET /metrics`: open to anyone (load balancers, Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from orchestrator.api.deps import ContextDep

router = APIRouter(tags=["health"])


@router.get("/health")
async def health(ctx: ContextDep) -> dict[str, object]:
    # Healthy means Redis answers: without it no heartbeat can be served. (No docstring on endpoints
    # in this package: FastAPI would publish it as the OpenAPI description.)
    await ctx.redis.ping()
    return {"status": "ok", "pool_id": ctx.settings.pool_id}


@router.get("/metrics")
async def metrics(ctx: ContextDep) -> Response:
    return Response(ctx.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
