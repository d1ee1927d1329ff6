"""`intellect-discovery`: run the discovery service, print its admin token."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from discovery.settings import DiscoverySettings
from intellect.cli import add_settings_commands, service_app, settings_from_flags
from intellect.logs import setup_logging

app = service_app("Intellect discovery service: signed node metadata, checked on chain.")

console = Console()


def _settings(**overrides: object) -> DiscoverySettings:
    return settings_from_flags(DiscoverySettings, **overrides)


@app.command()
def serve(
    host: str = typer.Option(None, help="bind address (INTELLECT_DISCOVERY_HOST)"),
    port: int = typer.Option(None, help="port (INTELLECT_DISCOVERY_PORT, default 8089)"),
    redis_url: str = typer.Option(None, help="Redis URL; default: start the embedded redis-server"),
    rpc_url: str = typer.Option(None, help="EVM JSON-RPC URL"),
    deployment: Path = typer.Option(None, help="deployment JSON written by `intellect-pool deploy`"),
    state_dir: Path = typer.Option(None, help="where the admin token and embedded Redis data live"),
    pool_id: int = typer.Option(None, help="check uploads against this pool's hardware requirements"),
    max_nodes_per_ip: int = typer.Option(None, help="nodes allowed behind one IP"),
    require_whitelisted_provider: bool = typer.Option(None, "--require-whitelist/--no-require-whitelist",
                                                      help="refuse nodes of non-whitelisted providers"),
    sync_interval: float = typer.Option(None, help="seconds between on-chain refreshes"),
    log_level: str = typer.Option("info", help="debug, info, warning"),
) -> None:
    """Serve the discovery API (PUT /nodes, GET /pools/{id}/nodes, GET /nodes, GET /nodes/{address})."""
    import uvicorn

    from discovery.app import create_app
    from intellect.http_server import exit_if_port_taken, server_options

    settings = _settings(host=host, port=port, redis_url=redis_url, rpc_url=rpc_url, deployment=deployment,
                         state_dir=state_dir, pool_id=pool_id, max_nodes_per_ip=max_nodes_per_ip,
                         require_whitelisted_provider=require_whitelisted_provider,
                         sync_interval_seconds=sync_interval)
    exit_if_port_taken(settings.host, settings.port, "discovery API")
    setup_logging(log_level)
    console.print(f"discovery on http://{settings.host}:{settings.port} "
                  f"(admin token in {settings.admin_token_file})")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=log_level,
                **server_options())


add_settings_commands(app, DiscoverySettings, "discovery", lambda s: s.admin_token_file)

if __name__ == "__main__":
    app()
