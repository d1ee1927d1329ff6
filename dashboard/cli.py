"""`intellect-dashboard serve`: the read-only web dashboard of one pool."""

from __future__ import annotations

from pathlib import Path

import typer
import uvicorn

from dashboard.server import create_app
from dashboard.settings import DashboardSettings
from intellect.http_server import exit_if_port_taken, server_options
from intellect.logs import configure_logging

app = typer.Typer(help="A read-only web dashboard of one pool.", no_args_is_help=True)


@app.callback()
def main() -> None:
    """A read-only web dashboard of one pool."""


@app.command()
def serve(
    host: str | None = typer.Option(None, help="address to listen on [env INTELLECT_DASHBOARD_HOST]"),
    port: int | None = typer.Option(None, help="port [env INTELLECT_DASHBOARD_PORT]"),
    orchestrator_url: str | None = typer.Option(None, help="orchestrator base URL"),
    orchestrator_token_file: Path | None = typer.Option(None, help="the orchestrator's admin token file"),
    validator_url: str | None = typer.Option(None, help="validator API base URL"),
    trainer_url: str | None = typer.Option(None, help="trainer base URL"),
    trainer_dir: Path | None = typer.Option(
        None, help="the trainer's output folder: the reward curve from its step manifests when it is gone"
    ),
    rpc_url: str | None = typer.Option(None, help="chain RPC URL"),
    deployment: Path | None = typer.Option(None, help="deployment.json"),
    pool_id: int | None = typer.Option(None, help="pool id"),
) -> None:
    """Serve the dashboard; every unset flag falls back to INTELLECT_DASHBOARD_* or .env."""
    overrides = {k: v for k, v in locals().items() if v is not None}
    settings = DashboardSettings(**overrides)
    exit_if_port_taken(settings.host, settings.port, "dashboard")
    configure_logging()
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning",
                **server_options())
