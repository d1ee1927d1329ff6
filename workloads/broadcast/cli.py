"""`intellect-broadcast`'s entry point: a plain `fetch` takes a quick path, everything else the typer app.

Why: a worker fetching a checkpoint starts this interpreter for every version, and the start is on
the critical path of the end-to-end time. The typer app (commands.py) costs typer and rich, and its
logging set-up (`intellect.logs`) and settings cost pydantic-settings and py_ecc: about 0.4-0.5 s of
the 0.8-0.9 s it took here to reach the first request, longer than moving 512 MB on loopback. The
quick path parses exactly `[--log-level L] fetch` with fetch's options (each as `--opt V` or
`--opt=V`), reads the same `INTELLECT_BROADCAST_*` / `INTELLECT_LOG_*` variables, sets logging up
exactly as `intellect.logs.setup_logging` does, and prints the same output. Anything else (`--help`,
an unknown or invalid option, a `.env` file, which `setup_logging` would read) goes to the typer app,
which then answers as always. `app` is still importable from here (loaded on first access).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer

LEVELS = {"debug", "info", "warning", "error", "critical"}
VALUED = {"--version", "--out", "--relay", "--sha256", "--concurrency", "--wait"}


@dataclass
class FetchArgs:
    version: int = 0
    out: str = ""
    relays: list[str] = field(default_factory=list)
    sha256: str | None = None
    concurrency: int | None = None
    wait: float = 0.0
    shardcast: bool = False
    as_json: bool = False
    log_level: str = "info"


def _env(name: str) -> str | None:
    """An environment variable by case-insensitive name, as pydantic-settings reads them."""
    wanted = name.lower()
    return next((v for k, v in os.environ.items() if k.lower() == wanted), None)


def parse_fetch(argv: list[str]) -> FetchArgs | None:
    """The fetch arguments in `argv`, or None when the quick path must not take it (typer decides)."""
    args, i = FetchArgs(), 0
    level = _env("INTELLECT_LOG_LEVEL")
    if argv[:1] == ["--log-level"] and len(argv) > 1:
        level, i = argv[1], 2
    elif argv[:1] and argv[0].startswith("--log-level="):
        level, i = argv[0].split("=", 1)[1], 1
    if argv[i : i + 1] != ["fetch"] or (level is not None and level.lower() not in LEVELS):
        return None
    args.log_level = (level or "info").lower()
    rest = argv[i + 1 :]
    try:
        concurrency = _env("INTELLECT_BROADCAST_CLIENT_CONCURRENCY")
        args.concurrency = int(concurrency) if concurrency not in (None, "") else None
        timeout = _env("INTELLECT_BROADCAST_TIMEOUT_SECONDS")
        if timeout is not None and not float(timeout) > 0:
            return None
        j = 0
        while j < len(rest):
            name, eq, value = rest[j].partition("=")
            if name in VALUED:
                if not eq:
                    if j + 1 >= len(rest):
                        return None
                    value, j = rest[j + 1], j + 1
                if name == "--version":
                    args.version = int(value)
                elif name == "--out":
                    args.out = value
                elif name == "--relay":
                    args.relays.append(value)
                elif name == "--sha256":
                    args.sha256 = value
                elif name == "--concurrency":
                    args.concurrency = int(value)
                else:
                    args.wait = float(value)
            elif rest[j] == "--shardcast":
                args.shardcast = True
            elif rest[j] == "--json":
                args.as_json = True
            else:
                return None
            j += 1
    except ValueError:
        return None
    valid = args.version >= 1 and args.out and args.relays and args.wait >= 0
    if not valid or (args.concurrency is not None and args.concurrency < 1):
        return None
    return args


def setup_quick_logging(level: str) -> None:
    """`intellect.logs.setup_logging(level)` without reading its settings class (what costs at start-up):
    the format from `INTELLECT_LOG_FORMAT`."""
    from intellect.logs import route_logs

    route_logs(level, _env("INTELLECT_LOG_FORMAT") or "json")


def quick_fetch(args: FetchArgs) -> int:
    """Run `fetch` as the typer command does; the process exit code."""
    setup_quick_logging(args.log_level)
    from workloads.broadcast.client import download
    from workloads.broadcast.errors import BroadcastError

    timeout = float(_env("INTELLECT_BROADCAST_TIMEOUT_SECONDS") or 30.0)
    try:
        if args.shardcast:
            from workloads.broadcast.shardcast_compat import download_shardcast

            result = download_shardcast(
                args.version, Path(args.out), args.relays, concurrency=args.concurrency or 6, timeout=timeout,
                wait_seconds=args.wait,
            )  # fmt: skip
        else:
            result = download(
                args.version, Path(args.out), args.relays, expected_sha256=args.sha256,
                concurrency=args.concurrency, timeout=timeout, wait_seconds=args.wait,
            )  # fmt: skip
    except BroadcastError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.as_json:
        print(json.dumps(result.as_dict()))
    else:
        print(f"v{result.version} → {result.path}: {result.size} bytes in {result.seconds:.2f}s "
              f"({result.mb_per_s:.0f} MB/s), verified {result.digest}")  # fmt: skip
    return 0


def main() -> None:
    args = parse_fetch(sys.argv[1:]) if not Path(".env").exists() else None
    if args is not None:
        sys.exit(quick_fetch(args))
    from workloads.broadcast.commands import app

    app()


def __getattr__(name: str) -> typer.Typer:
    """`from workloads.broadcast.cli import app`: the typer app, loaded on first use."""
    if name == "app":
        from workloads.broadcast.commands import app

        return app
    raise AttributeError(name)
