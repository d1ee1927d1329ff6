"""`intellect-orchestrator`: run the orchestrator, print its admin token, show settings."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from intellect.cli import add_settings_commands, service_app, settings_from_flags
from intellect.http_server import exit_if_port_taken
from intellect.logs import setup_logging
from orchestrator.context import MULTIPROC_ENV
from orchestrator.settings import OrchestratorSettings

if TYPE_CHECKING:  # the server stack is imported by the commands that run it, so --help stays fast
    from fastapi import FastAPI

    from intellect.redis_server import EmbeddedRedis

app = service_app("Intellect orchestrator: invites, heartbeats, liveness and the task API of one pool.")

console = Console()


def _settings(**overrides: object) -> OrchestratorSettings:
    return settings_from_flags(OrchestratorSettings, **overrides)


def _configure_logging(level: str) -> None:
    setup_logging(level)


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
    workers: int = typer.Option(1, min=1, help="API processes sharing the port (state is in Redis and SQL; "
                                "only the leader runs the background loops)"),
    keep_alive: float = typer.Option(5.0, min=0, help="seconds an idle HTTP connection stays open; above "
                                     "the heartbeat interval, workers that reuse a connection skip the TCP "
                                     "handshake"),
    access_log: bool = typer.Option(False, "--access-log/--no-access-log",
                                    help="log every request (1,000 lines a second at 10,000 workers)"),
) -> None:
    """Serve the orchestrator API and run the invite and liveness loops."""
    import uvicorn

    from intellect.http_server import server_options as http_server_options
    from orchestrator.app import create_app

    settings = _settings(
        host=host, port=port, public_url=public_url, pool_id=pool_id, redis_url=redis_url,
        database_url=database_url, rpc_url=rpc_url, deployment=deployment, state_dir=state_dir,
        discovery_url=discovery_url, manager_keystore=manager_keystore,
        heartbeat_interval_seconds=heartbeat_interval, heartbeat_ttl_seconds=heartbeat_ttl,
        check_interval_seconds=check_interval, miss_threshold=miss_threshold,
        eject_dead_nodes=eject_dead_nodes,
    )
    exit_if_port_taken(settings.host, settings.port, "orchestrator API")
    if settings.manager_key is None and settings.manager_keystore is None:
        # Before anything starts (Redis, the database): one line, not a traceback out of the lifespan.
        Console(stderr=True).print("[red]no pool manager key:[/red] set INTELLECT_ORCH_MANAGER_KEY "
                                   "(the key, or file:PATH) or pass --manager-keystore")
        raise typer.Exit(2)
    _configure_logging(log_level)
    console.print(f"orchestrator for pool {settings.pool_id} on http://{settings.host}:{settings.port} "
                  f"(admin token in {settings.admin_token_file})")
    # uvloop and httptools are installed, so uvicorn's "auto" picks them (about 2x the asyncio/h11 pair).
    server_options = dict(host=settings.host, port=settings.port, log_level=log_level,
                          timeout_keep_alive=keep_alive, backlog=4096, access_log=access_log,
                          **http_server_options())
    if workers == 1:
        uvicorn.run(create_app(settings), **server_options)  # type: ignore[arg-type]
        return
    _serve_replicas(settings, server_options, workers, log_level)


def _serve_replicas(settings: OrchestratorSettings, server_options: dict[str, Any], workers: int,
                    log_level: str) -> None:
    """`serve --workers N`: N API processes sharing the port (uvicorn's supervisor spawns them) and, when
    the loops run, one more process for the loops alone; what they share is made once, here, first."""
    import uvicorn

    loops = settings.run_background_loops
    embedded = _prepare_replicas(settings, log_level)
    metrics_dir = _multiprocess_metrics_dir()
    background = None
    if loops:
        # The invite, liveness and group loops get a process of their own: in an API process their
        # SQL passes (thousands of rows in a thread) would hold the GIL and stall heartbeats.
        import multiprocessing

        os.environ["INTELLECT_ORCH_RUN_BACKGROUND_LOOPS"] = "false"
        background = multiprocessing.get_context("spawn").Process(
            target=_background_main, name="orchestrator-loops", daemon=False)
        background.start()
    try:
        uvicorn.run("orchestrator.cli:app_from_environment", factory=True, workers=workers,
                    **server_options)
    finally:
        if background is not None and background.is_alive():
            background.terminate()  # SIGTERM by pid: it leaves its lifespan cleanly
            background.join(timeout=30)
            if background.is_alive():
                background.kill()
        if embedded is not None:
            embedded.stop()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _multiprocess_metrics_dir() -> Path | None:
    """Prometheus multiprocess mode for `serve --workers N`: every process writes its samples under
    PROMETHEUS_MULTIPROC_DIR and `/metrics`, whichever process answers, sums them all. The spawned
    processes read the variable when they import prometheus_client, so it is set before they start.
    Returns the directory made here (removed on exit); None when the operator set their own."""
    if os.environ.get(MULTIPROC_ENV):
        return None
    directory = Path(tempfile.mkdtemp(prefix="intellect-prometheus-"))
    os.environ[MULTIPROC_ENV] = str(directory)
    return directory


_LOG_LEVEL_ENV = "INTELLECT_ORCH_SERVE_LOG_LEVEL"


def _prepare_replicas(settings: OrchestratorSettings, log_level: str) -> EmbeddedRedis | None:
    """Before forking API processes: one embedded Redis, migrations once, settings in the environment.

    The processes are spawned, so they rebuild the settings from `INTELLECT_ORCH_*` variables; the
    parent owns what must exist once (the Redis it started, the schema).
    """
    from pydantic import SecretStr

    from intellect.identity import PASSPHRASE_ENV, resolve_passphrase
    from intellect.redis_server import redis_url_or_embedded
    from orchestrator.app import create_app
    from orchestrator.db import make_engine, migrate

    settings.redis_url, embedded = redis_url_or_embedded(settings.redis_url, settings.state_dir)
    # Files made on first start (admin token, storage secret) must be made once, not raced by N processes.
    create_app(settings)
    engine = make_engine(settings.effective_database_url)
    migrate(engine)
    engine.dispose()
    if settings.manager_key is None and settings.manager_keystore is not None \
            and PASSPHRASE_ENV not in os.environ:
        os.environ[PASSPHRASE_ENV] = resolve_passphrase()  # ask once, not once per process
    for name, value in settings.model_dump(mode="json", exclude_none=True).items():
        secret = getattr(settings, name)
        if isinstance(secret, SecretStr):
            value = secret.get_secret_value()
        elif isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, dict | list):
            value = json.dumps(value)
        os.environ[f"INTELLECT_ORCH_{name.upper()}"] = str(value)
    os.environ[_LOG_LEVEL_ENV] = log_level
    return embedded


def _background_main() -> None:
    """The loops-only process of `serve --workers N`: the app's lifespan without an HTTP server."""
    import asyncio
    import signal
    import threading

    from orchestrator.app import create_app

    _configure_logging(os.environ.get(_LOG_LEVEL_ENV, "info"))
    app = create_app(OrchestratorSettings(run_background_loops=True))

    parent = os.getppid()

    async def run() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)

        async def orphaned() -> None:  # the supervisor was killed outright: do not linger, holding the lease
            while os.getppid() == parent:
                await asyncio.sleep(1)
            stop.set()

        watch = asyncio.create_task(orphaned())
        async with app.router.lifespan_context(app):
            await stop.wait()
            # Shutdown may wait on a peer or a chain call in a thread: bound it.
            deadline = threading.Timer(20, os._exit, (0,))
            deadline.daemon = True  # a clean exit does not wait for it
            deadline.start()
        watch.cancel()

    asyncio.run(run())


def app_from_environment() -> FastAPI:
    """uvicorn factory for each API process of `serve --workers N`."""
    from orchestrator.app import create_app

    _configure_logging(os.environ.get(_LOG_LEVEL_ENV, "info"))
    return create_app(OrchestratorSettings())


@app.command("nodes")
def nodes(
    url: str = typer.Option("http://127.0.0.1:8090", help="orchestrator URL"),
    state_dir: Path = typer.Option(None, help="state directory holding the admin token"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """List the pool's nodes with their states (admin API)."""
    import httpx

    from intellect.auth import read_admin_token

    try:
        token = read_admin_token(_settings(state_dir=state_dir).admin_token_file, "orchestrator")
    except ValueError as exc:
        console.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from None
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
    table = Table("address", "state", "worker", "joined via", "last heartbeat", "task", "reason")
    for node in data["nodes"]:
        task = node.get("task") or {}
        task_text = f"{task.get('task_id', '')} {task.get('state', '')}"
        table.add_row(node["address"], node["state"], node.get("worker_url") or "",
                      node.get("joined_via") or "", node.get("last_heartbeat_at") or "", task_text,
                      node.get("reason") or "")
    console.print(table)
    console.print(", ".join(f"{k}: {v}" for k, v in data["counts"].items() if v))


add_settings_commands(app, OrchestratorSettings, "orchestrator", lambda s: s.admin_token_file)

if __name__ == "__main__":
    app()
