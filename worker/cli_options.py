"""The options every `intellect-worker` command shares, each mapping to a WorkerSettings field, and
the worker's failures a user can fix. How a command prints (one line per error, `--json` or a
table) is every CLI's, in `intellect.cli`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from intellect.cli import one_line_errors
from intellect.identity import IdentityError
from ledger.errors import LedgerError
from worker.chain import RegistrationDeclined
from worker.settings import WorkerSettings

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


# A command's expected failures as one line and exit code 1 (a decorator: `@friendly`).
friendly = one_line_errors(CliError, IdentityError, FileNotFoundError, LedgerError, RegistrationDeclined,
                           ValueError)  # fmt: skip
