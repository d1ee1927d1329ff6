"""The dashboard service: `GET /` (the page), `GET /fragment` (its live panels), `GET /api/snapshot`
(the same data as JSON), `/health`, `/metrics`. Read-only by construction: it has no route that
changes anything, and the orchestrator's admin token stays on the server."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from dashboard.settings import DashboardSettings
from dashboard.snapshot import Snapshot, hold_last_good, reward_svg, take
from dashboard.sources import ChainSource, OrchestratorSource, Section, Source, TrainerSource, ValidatorSource
from intellect.http_guard import guard
from ledger.client import LedgerClient

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).with_name("templates")))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.4f}".rstrip("0").rstrip(".")
    return str(value)


HEX = re.compile(r"^0x[0-9a-fA-F]{20,}$")


def _cell(value: Any) -> Markup:
    """A table cell's HTML: a long address, work key or tx hash is shown as 0x1234…abcd with the whole
    value in its title (hover) and copied on click; everything else as text, escaped."""
    text = _fmt(value)
    if HEX.match(text):
        return Markup('<span class="hex" title="{0}" data-copy="{0}">{1}…{2}</span>').format(
            text, text[:8], text[-6:]
        )
    return Markup.escape(text)


TEMPLATES.env.globals["fmt"] = _fmt
TEMPLATES.env.globals["cell"] = _cell


class Dashboard:
    """The sources and a short-lived cache, so many open browsers cost one upstream read per second."""

    def __init__(self, settings: DashboardSettings, sources: list[Source]) -> None:
        self.settings = settings
        self.sources = sources
        self._cached: Snapshot | None = None
        self._last_good: dict[str, Section] = {}
        self.registry = CollectorRegistry()
        self.reads = Counter("dashboard_snapshots_total", "upstream snapshots taken", registry=self.registry)

    def snapshot(self) -> Snapshot:
        if self._cached is None or time.time() - self._cached.taken_at > 1.0:
            self._cached = hold_last_good(take(self.sources, self.settings.pool_id), self._last_good)
            self.reads.inc()
        return self._cached


def build_sources(settings: DashboardSettings) -> list[Source]:
    sources: list[Source] = []
    timeout = settings.timeout_seconds
    if settings.orchestrator_url and settings.orchestrator_token_file:
        token = settings.orchestrator_token_file.read_text().strip()
        sources.append(OrchestratorSource(settings.orchestrator_url, token, timeout))
    if settings.validator_url:
        sources.append(ValidatorSource(settings.validator_url, settings.pool_id, timeout))
    if settings.trainer_url:
        sources.append(TrainerSource(settings.trainer_url, timeout, settings.trainer_dir))
    if settings.rpc_url and settings.deployment:
        sources.append(ChainSource(LedgerClient(settings.rpc_url, settings.deployment), settings.pool_id))
    return sources


def get_dashboard(request: Request) -> Dashboard:
    dashboard: Dashboard = request.app.state.dashboard
    return dashboard


DashboardDep = Annotated[Dashboard, Depends(get_dashboard)]
router = APIRouter()


def _context(dashboard: Dashboard) -> dict[str, Any]:
    snap = dashboard.snapshot()
    points = [(int(r["step"]), float(r["reward"])) for r in snap.panels["rewards"].rows]
    return {
        "snap": snap,
        "svg": reward_svg(points),
        "refresh": dashboard.settings.refresh_seconds,
        "updated": datetime.fromtimestamp(snap.taken_at, UTC).strftime("%H:%M:%S UTC"),
    }


@router.get("/", response_class=HTMLResponse, summary="the dashboard page")
def page(request: Request, dashboard: DashboardDep) -> HTMLResponse:
    return TEMPLATES.TemplateResponse(request, "index.html", _context(dashboard))


@router.get("/fragment", response_class=HTMLResponse, summary="the page's live panels (for the refresh)")
def fragment(request: Request, dashboard: DashboardDep) -> HTMLResponse:
    return TEMPLATES.TemplateResponse(request, "panels.html", _context(dashboard))


@router.get("/api/snapshot", response_model=Snapshot, summary="everything the page shows, as JSON")
def snapshot(dashboard: DashboardDep) -> Snapshot:
    return dashboard.snapshot()


@router.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/metrics", response_class=Response, summary="Prometheus metrics (text format)")
def metrics(dashboard: DashboardDep) -> Response:
    return Response(generate_latest(dashboard.registry), media_type=CONTENT_TYPE_LATEST)


def create_app(settings: DashboardSettings, sources: list[Source] | None = None) -> FastAPI:
    app = FastAPI(title="Intellect dashboard", version="1", description=__doc__)
    app.state.dashboard = Dashboard(settings, build_sources(settings) if sources is None else sources)
    app.include_router(router)
    return guard(app, max_body=1024)
