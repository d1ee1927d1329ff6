"""What every `intellect-worker` command shares: the consoles, the options that map to WorkerSettings
fields, the one-line error wrapper and the JSON/table printers."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from intellect.identity import IdentityError
from ledger.errors import LedgerError
from worker.chain import RegistrationDeclined
from worker.settings import WorkerSettings

console = Console()
err = Console(stderr=True, soft_wrap=True)  # one unwrapped line per error

# ---- shared options (each maps to a WorkerSettings field; unset means env or default) ----
RpcUrl = Annotated[str | None, typer.Option("--rpc-url", help="EVM RPC URL (env INTELLECT_WORKER_RPC_URL)")]
DeploymentOpt = Annotated[Path | None, typer.Option("--deployment", help="deployment JSON of the contracts")]
DiscoveryUrl = Annotated[str | None, typer.Option("--discovery-url", help="discovery service URL")]
PoolId = Annotated[int | None, typer.Option("--pool-id", help="compute pool to join")]
StateDir = Annotated[Path | None, typer.Option("--state-dir", help="keys and state [~/.intellect/worker]")]
JsonOut = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


class CliError(Exception):
    """A problem the user can fix; printed as one line, exit code 1."""


def build_settings(**flags: Any) -> WorkerSettings:
    """Flags that were given override the environment; the rest comes from env and defaults."""
    try:
        return WorkerSettings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise CliError(f"bad setting: {problems}") from None


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn expected failures into a one-line message and exit code 1, no traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (CliError, IdentityError, FileNotFoundError, LedgerError, RegistrationDeclined,
                ValueError) as exc:
            err.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(1) from None

    return wrapper


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")



def show_rows(rows: list[dict[str, Any]], json_out: bool, title: str) -> None:
    """Rows as JSON (--json) or as one table."""
    if json_out:
        print_json(rows)
        return
    table = Table(title=title)
    for col in rows[0]:
        # Addresses print whole: they are what one copies to fund, whitelist or invite.
        table.add_column(col, no_wrap=col == "address", min_width=42 if col == "address" else None,
                         overflow="fold")
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    console.print(table)
