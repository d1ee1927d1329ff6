"""`intellect-broadcast`'s commands (typer): run an origin or a relay, publish a checkpoint, fetch a version.

Defaults come from `INTELLECT_BROADCAST_*` environment variables (see settings.py); flags win.
Servers are imported lazily so `fetch` (run on every inference worker) never loads FastAPI; a plain
`fetch` does not even load this module (cli.py: the quick path).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from intellect.http_server import exit_if_port_taken
from intellect.logs import setup_logging
from workloads.broadcast.errors import BroadcastError
from workloads.broadcast.settings import BroadcastSettings

app = typer.Typer(
    help="Checkpoint broadcast: trainer → origin → relays → inference workers.", no_args_is_help=True
)
console = Console()
err = Console(stderr=True, soft_wrap=True)
defaults = BroadcastSettings()


@app.callback()
def _main(
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error"),
) -> None:
    """Checkpoint broadcast: trainer → origin → relays → inference workers.

    A version is a trainer step: one file cut into shards with sha256 each. The origin publishes,
    relays mirror it (serving shards while still fetching), workers fetch from several relays."""
    setup_logging(level=log_level)


def _fail(exc: Exception, code: int = 1) -> typer.Exit:
    err.print(f"error: {exc}", markup=False)
    return typer.Exit(code)


def _is_http_url(text: str) -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(text)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


@app.command()
def origin(
    directory: Path = typer.Option(..., "--dir", help="version store (created if missing)"),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    host: str = typer.Option("127.0.0.1", "--host", help="address to bind (0.0.0.0 to serve other machines)"),
    watch: Path | None = typer.Option(None, "--watch", help="trainer checkpoint dir: publish each new step"),
    keep: int = typer.Option(defaults.keep, "--keep", min=1, help="versions kept on disk"),
    shard_size: int = typer.Option(defaults.shard_size, "--shard-size", min=1, help="bytes per shard"),
) -> None:
    """Serve the versions in --dir (and publish new trainer steps from --watch)."""
    if watch is not None and not watch.is_dir():
        raise _fail(ValueError(f"--watch {watch}: no such folder (the trainer's --output-dir; start the "
                               "trainer first, it creates it)"), 2)  # fmt: skip
    import uvicorn

    from workloads.broadcast.origin import create_origin_app
    from workloads.broadcast.sendfile import server_options
    from workloads.broadcast.store import VersionStore

    exit_if_port_taken(host, port, "checkpoint origin")
    store = VersionStore(directory, keep=keep)
    api = create_origin_app(
        store, watch=watch, shard_size=shard_size, poll_seconds=defaults.poll_seconds,
        probe_size=defaults.probe_size,
    )  # fmt: skip
    uvicorn.run(api, host=host, port=port, log_config=None, access_log=False, **server_options())


@app.command()
def relay(
    upstream: str = typer.Option(..., "--upstream", help="origin or relay URL to follow"),
    directory: Path = typer.Option(..., "--dir", help="mirror store (created if missing)"),
    port: int = typer.Option(8001, "--port", min=1, max=65535),
    host: str = typer.Option("127.0.0.1", "--host", help="address to bind (0.0.0.0 to serve other machines)"),
    keep: int = typer.Option(defaults.keep, "--keep", min=1, help="versions kept on disk"),
    concurrency: int = typer.Option(
        defaults.relay_concurrency, "--concurrency", min=1, help="shards in flight"
    ),
) -> None:
    """Mirror an upstream and serve its versions, shards available as soon as they are verified."""
    if not _is_http_url(upstream):
        raise _fail(ValueError(f"--upstream {upstream!r} is not a URL: give the origin's or a relay's, "
                               "e.g. http://127.0.0.1:8093"), 2)  # fmt: skip
    import uvicorn

    from workloads.broadcast.relay import create_relay_app
    from workloads.broadcast.sendfile import server_options
    from workloads.broadcast.store import VersionStore

    exit_if_port_taken(host, port, "checkpoint relay")
    store = VersionStore(directory, keep=keep)
    api = create_relay_app(
        upstream, store, concurrency=concurrency, poll_seconds=defaults.poll_seconds,
        shard_wait=defaults.shard_wait_seconds, timeout=defaults.timeout_seconds,
        probe_size=defaults.probe_size,
    )  # fmt: skip
    uvicorn.run(api, host=host, port=port, log_config=None, access_log=False, **server_options())


@app.command()
def publish(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="checkpoint file to publish"),
    version: int = typer.Option(..., "--version", min=1, help="version number (the trainer step)"),
    directory: Path = typer.Option(..., "--dir", help="the origin's version store"),
    keep: int = typer.Option(defaults.keep, "--keep", min=1, help="versions kept on disk"),
    shard_size: int = typer.Option(defaults.shard_size, "--shard-size", min=1, help="bytes per shard"),
    sha256: str | None = typer.Option(None, "--sha256", help="refuse the file unless it hashes to this"),
    as_json: bool = typer.Option(False, "--json", help="print the manifest summary as JSON"),
) -> None:
    """Split FILE into --dir as --version; a running origin on that dir serves it within a second."""
    from workloads.broadcast.origin import publish as do_publish
    from workloads.broadcast.store import VersionStore

    try:
        manifest = do_publish(VersionStore(directory, keep=keep), file, version, shard_size, sha256)
    except BroadcastError as exc:
        raise _fail(exc) from None
    summary = {"version": manifest.version, "size": manifest.size, "shards": len(manifest.shards),
               "sha256": manifest.sha256, "blake3": manifest.blake3}  # fmt: skip
    if as_json:
        print(json.dumps(summary))
    else:
        console.print(
            f"published v{manifest.version}: {manifest.size} bytes in {len(manifest.shards)} shards, "
            f"sha256 {manifest.sha256}"
        )


@app.command()
def fetch(
    version: int = typer.Option(..., "--version", min=1, help="version (trainer step) to download"),
    out: Path = typer.Option(..., "--out", help="destination file (replaced only once verified)"),
    relays: list[str] = typer.Option(..., "--relay", help="relay or origin URL (repeat for several)"),
    sha256: str | None = typer.Option(None, "--sha256", help="expected whole-file sha256"),
    concurrency: int | None = typer.Option(
        defaults.client_concurrency, "--concurrency", min=1,
        help="shards at once (default: two per relay, at most cores - 1)",
    ),
    wait: float = typer.Option(0.0, "--wait", min=0, help="seconds to wait for the version to appear"),
    shardcast: bool = typer.Option(False, "--shardcast", help="the relays are shardcast 0.3.2 servers"),
    as_json: bool = typer.Option(False, "--json", help="print the result as one JSON object"),
) -> None:
    """Download --version from the relays into --out. Exit 1 with a reason when it cannot."""
    from workloads.broadcast.client import download
    from workloads.broadcast.shardcast_compat import download_shardcast

    try:
        if shardcast:
            result = download_shardcast(
                version, out, relays, concurrency=concurrency or 6, timeout=defaults.timeout_seconds,
                wait_seconds=wait,
            )  # fmt: skip
        else:
            result = download(
                version, out, relays, expected_sha256=sha256, concurrency=concurrency,
                timeout=defaults.timeout_seconds, wait_seconds=wait,
            )  # fmt: skip
    except BroadcastError as exc:
        raise _fail(exc) from None
    if as_json:
        print(json.dumps(result.as_dict()))
    else:
        console.print(f"v{result.version} → {result.path}: {result.size} bytes in {result.seconds:.2f}s "
                      f"({result.mb_per_s:.0f} MB/s), verified {result.digest}")  # fmt: skip


def main() -> None:
    app()  # the entry point is cli.main, which tries the quick fetch first
