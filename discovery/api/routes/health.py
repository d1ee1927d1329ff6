"""`GET /health` and `GET /metrics`: open to anyone (load balancers, Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from discovery.api.deps import MetricsDep, StoreDep

router = APIRouter(tags=["health"])


@router.get("/health")
async def health(store: StoreDep) -> dict[str, str]:
    # Healthy means Redis answers: every record lives there. (No docstrings on endpoints: FastAPI
    # would publish them as the OpenAPI description.)
    await store.redis.ping()
    return {"status": "ok"}


@router.get("/metrics")
async def metrics(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
