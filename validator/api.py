"""The validator's HTTP API: `GET /verdicts`, `GET /accepted` (the trainer's only input),
`GET /files/{sha256}` (accepted files' exact bytes), `/health`, `/metrics`. Read-only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field

from intellect.http_guard import guard
from intellect.wire.verdicts import JudgedBy
from validator.service import ValidatorService
from validator.store import VerdictRow


class VerdictItem(BaseModel):
    cursor: int
    pool_id: int
    work_key: str
    node: str
    sha256: str
    verdict: str
    reasons: list[str]
    rows: int
    tokens: int
    step: int | None
    seconds: float
    timings: dict[str, float]
    judged_by: JudgedBy | None = Field(None, description="the limits that judged it: its calibration record")
    tx_hash: str | None
    vote_state: str
    decided_at: float


class AcceptedItem(BaseModel):
    cursor: int
    pool_id: int
    work_key: str
    node: str
    step: int | None
    rows: int
    tokens: int
    url: str
    sha256: str
    block_number: int
    accepted_at: float


class Page(BaseModel):
    items: list[Any]
    next: int


def get_service(request: Request) -> ValidatorService:
    service: ValidatorService = request.app.state.service
    return service


Service = Annotated[ValidatorService, Depends(get_service)]
# SQL integers are 64-bit signed: a larger value is a 422, never an OverflowError (500) in the store.
MAX_SQL_INT = 2**63 - 1
Pool = Annotated[int | None, Query(alias="pool", ge=1, le=MAX_SQL_INT, description="pool id")]
After = Annotated[int, Query(ge=0, le=MAX_SQL_INT, description="cursor: items with a larger cursor")]
Limit = Annotated[int, Query(ge=1, le=1000)]

verdicts_router = APIRouter(tags=["verdicts"])
files_router = APIRouter(tags=["files"])
ops_router = APIRouter(tags=["operations"])


def _verdict(row: VerdictRow) -> VerdictItem:
    return VerdictItem(
        cursor=row.id, pool_id=row.pool_id, work_key=row.work_key, node=row.node, sha256=row.sha256,
        verdict=row.verdict, reasons=json.loads(row.reasons), rows=row.rows, tokens=row.tokens, step=row.step,
        seconds=row.seconds, timings=json.loads(row.timings), tx_hash=row.vote_tx, vote_state=row.vote_state,
        decided_at=row.decided_at,
        judged_by=JudgedBy.model_validate_json(row.judged_by) if row.judged_by else None,
    )  # fmt: skip


@verdicts_router.get("/verdicts", response_model=Page, summary="every decision, in order, with reasons")
def verdicts(
    service: Service, pool: Pool = None, node: str | None = None, after: After = 0, limit: Limit = 100
) -> Page:
    rows = service.verdicts.page(pool_id=pool, node=node, after=after, limit=limit)
    return Page(items=[_verdict(r) for r in rows], next=rows[-1].id if rows else after)


@verdicts_router.get("/accepted", response_model=Page, summary="accepted files, in order: the trainer's feed")
def accepted(
    request: Request, service: Service, pool: Pool = None, after: After = 0, limit: Limit = 100
) -> Page:
    rows = service.verdicts.page(pool_id=pool, node=None, after=after, limit=limit, accepted_only=True)
    base = str(request.base_url).rstrip("/")
    items = [
        AcceptedItem(
            cursor=r.id,
            pool_id=r.pool_id,
            work_key=r.work_key,
            node=r.node,
            step=r.step,
            rows=r.rows,
            tokens=r.tokens,
            url=f"{base}/files/{r.sha256}",
            sha256=r.sha256,
            block_number=r.block_number,
            accepted_at=r.decided_at,
        )  # fmt: skip
        for r in rows
    ]
    return Page(items=items, next=rows[-1].id if rows else after)


@files_router.get(
    "/files/{sha256}", summary="the exact bytes of an accepted file", response_class=FileResponse
)
def file(sha256: str, service: Service) -> FileResponse:
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise HTTPException(400, "sha256 must be 64 lowercase hex characters")
    row = service.verdicts.by_sha256(sha256)
    if row is None or not row.file_path or not Path(row.file_path).is_file():
        raise HTTPException(404, f"no accepted file with sha256 {sha256}")
    return FileResponse(
        row.file_path, media_type="application/vnd.apache.parquet", filename=f"{sha256}.parquet"
    )


@ops_router.get("/health")
def health(service: Service) -> dict[str, Any]:
    return {
        "status": "ok" if not service.errors else "degraded",
        "address": service.wallet.address,
        "pools": service.settings.pool_ids,
        "loop_errors": service.errors,
        "verdicts": service.verdicts.counts(),
    }


@ops_router.get("/metrics", response_class=Response, summary="Prometheus metrics (text format)")
def metrics(service: Service) -> Response:
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def create_app(service: ValidatorService) -> FastAPI:
    app = FastAPI(title="Intellect validator", version="1", description=__doc__)
    app.state.service = service
    for router in (verdicts_router, files_router, ops_router):
        app.include_router(router)
    return guard(app, max_body=1024)
