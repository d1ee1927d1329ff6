"""`intellect-orchestrator`: run the orchestrator, print its admin token, show settings."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from orchestrator.settings import OrchestratorSettings

app = typer.Typer(help="Intellect orchestrator: invites, heartbeats, liveness and the task API of one pool.",
                  no_args_is_help=True)
console = Console()


def _settings(**overrides: object) -> OrchestratorSettings:
    try:
        return OrchestratorSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValueError as exc:
        console.print(f"[red]invalid setting:[/red] {exc}")
        raise typer.Exit(2) from None


def _configure_logging(level: str) -> None:
    import structlog

    logging.basicConfig(level=level.upper(), format="%(message)s")
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"),
                    structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), logging.INFO)),
    )


@app.command()
def serve(
    host: str = typer.Option(None, help="bind address (INTELLECT_ORCH_HOST)"),
    port: int = typer.Option(None, help="port (default 8090)"),
    public_url: str = typer.Option(None, help="URL workers send heartbeats to"),
    pool_id: int = typer.Option(None, help="the pool this orchestrator manages"),
    redis_url: str = typer.Option(None, help="Redis URL; default: the embedded redis-server"),
    database_url: str = typer.Option(None, help="SQLAlchemy URL; default SQLite in the state dir"),
    rpc_url: str = typer.Option(None, help="EVM JSON-RPC URL"),
    deployment: Path = typer.Option(None, help="deployment JSON written by `intellect-pool deploy`"),
    state_dir: Path = typer.Option(None, help="admin token, SQLite and embedded Redis live here"),
    discovery_url: str = typer.Option(None, help="discovery service URL"),
    manager_keystore: Path = typer.Option(None, help="keystore of the pool manager key "
                                          "(or INTELLECT_ORCH_MANAGER_KEY)"),
    heartbeat_interval: float = typer.Option(None, help="seconds between worker heartbeats"),
    heartbeat_ttl: float = typer.Option(None, help="seconds a heartbeat keeps a node alive"),
    check_interval: float = typer.Option(None, help="seconds between liveness checks"),
    miss_threshold: int = typer.Option(None, help="missed checks before a node is Dead"),
    eject_dead_nodes: bool = typer.Option(None, "--eject-dead/--no-eject-dead",
                                          help="eject Dead nodes on chain"),
    log_level: str = typer.Option("info", help="debug, info, warning"),
) -> None:
    """Serve the orchestrator API and run the invite and liveness loops."""
    import uvicorn

    from orchestrator.app import create_app

    settings = _settings(
        host=host, port=port, public_url=public_url, pool_id=pool_id, redis_url=redis_url,
        database_url=database_url, rpc_url=rpc_url, deployment=deployment, state_dir=state_dir,
        discovery_url=discovery_url, manager_keystore=manager_keystore,
        heartbeat_interval_seconds=heartbeat_interval, heartbeat_ttl_seconds=heartbeat_ttl,
        check_interval_seconds=check_interval, miss_threshold=miss_threshold,
        eject_dead_nodes=eject_dead_nodes,
    )
    _configure_logging(log_level)
    console.print(f"orchestrator for pool {settings.pool_id} on http://{settings.host}:{settings.port} "
                  f"(admin token in {settings.admin_token_file})")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=log_level)


@app.command("admin-token")
def admin_token(
    state_dir: Path = typer.Option(None, help="the orchestrator's state directory"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Print the admin bearer token (created on first start if missing)."""
    from intellect.auth import load_or_create_admin_token

    settings = _settings(state_dir=state_dir)
    token = load_or_create_admin_token(settings.admin_token_file)
    typer.echo(json.dumps({"token": token, "file": str(settings.admin_token_file)}) if as_json else token)


@app.command("nodes")
def nodes(
    url: str = typer.Option("http://127.0.0.1:8090", help="orchestrator URL"),
    state_dir: Path = typer.Option(None, help="state directory holding the admin token"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """List the pool's nodes with their states (admin API)."""
    import httpx

    from intellect.auth import load_or_create_admin_token

    token = load_or_create_admin_token(_settings(state_dir=state_dir).admin_token_file)
    try:
        response = httpx.get(f"{url}/nodes", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    except httpx.HTTPError as exc:
        console.print(f"[red]cannot reach the orchestrator at {url}:[/red] {exc}")
        raise typer.Exit(1) from None
    if response.status_code != 200:
        console.print(f"[red]{response.status_code}:[/red] {response.text}")
        raise typer.Exit(1)
    data = response.json()
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    table = Table("address", "state", "worker", "last heartbeat", "task", "reason")
    for node in data["nodes"]:
        task = node.get("task") or {}
        task_text = f"{task.get('task_id', '')} {task.get('state', '')}"
        table.add_row(node["address"], node["state"], node.get("worker_url") or "",
                      node.get("last_heartbeat_at") or "", task_text, node.get("reason") or "")
    console.print(table)
    console.print(", ".join(f"{k}: {v}" for k, v in data["counts"].items() if v))


@app.command("show-config")
def show_config(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """The effective settings (flags > INTELLECT_ORCH_* env > .env > defaults); secrets hidden."""
    data = _settings().model_dump(mode="json")
    data["manager_key"] = "***" if data.get("manager_key") else None
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    table = Table("setting", "value")
    for key, value in data.items():
        table.add_row(key, str(value))
    console.print(table)


if __name__ == "__main__":
    app()
