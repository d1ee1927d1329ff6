"""What every command line starts from: a Typer app that sets up logging once for whichever command
runs (the one logging set-up per entry point, never on import), and settings built from flags over
environment and `.env`, where a bad value exits with code 2 naming the setting; the `admin-token` /
`show-config` commands of every service with an admin API; and the helpers every CLI prints with
(`intellect-pool`, `intellect-worker`, `intellect task`, ...): one line per error, never a traceback
(`fail`, `one_line_errors`), and `--json` or a table (`emit`, `print_json`, `show_rows`, `kv_table`).
A CLI's own options (the chain's, the worker's) stay with it; how it speaks to the user lives here."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import typer
from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from intellect.logs import setup_logging

S = TypeVar("S", bound=BaseSettings)
out = Console(soft_wrap=True)  # messages never break inside an address or hash
err = Console(stderr=True, soft_wrap=True)  # one unwrapped line per error


# ---- one line per error ------------------------------------------------------------------------
def say_error(message: str) -> None:
    """`error: <message>` on stderr, the message as written (never read as markup)."""
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False)


def fail(message: str) -> typer.Exit:
    """Say what to fix and give the exit to raise (code 1): `raise fail("no orchestrator given")`."""
    say_error(message)
    return typer.Exit(1)


@contextmanager
def one_line_errors(*kinds: type[BaseException]) -> Iterator[None]:
    """The expected failures `kinds` as one line on stderr and exit code 1 instead of a traceback;
    a pydantic error names its first field. A context manager, or a decorator of a command:
    `@one_line_errors(LedgerError, ValueError)`. Anything else still raises: a bug shows its trace."""
    try:
        yield
    except kinds as exc:
        if isinstance(exc, ValidationError):
            first = exc.errors()[0]
            say_error(f"{'.'.join(map(str, first['loc']))}: {first['msg']}")
        else:
            say_error(str(exc))
        raise typer.Exit(1) from None


# ---- output: --json or a table -----------------------------------------------------------------
def print_json(data: Any) -> None:
    """`data` as indented JSON on stdout (pydantic models and lists of them as their JSON form)."""
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    elif isinstance(data, list):
        data = [d.model_dump(mode="json") if isinstance(d, BaseModel) else d for d in data]
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def emit(data: Any, as_json: bool, table: Table | None = None, message: str | None = None) -> None:
    """`data` as JSON with `--json`; otherwise the table and/or the message (rich markup)."""
    if as_json:
        print_json(data)
        return
    if table is not None:
        out.print(table)
    if message:
        out.print(message, highlight=False)


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
    out.print(table)


def kv_table(title: str, rows: dict[str, Any]) -> Table:
    """A two-column table: one field and its value per line."""
    table = Table(title=title, show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for k, v in rows.items():
        table.add_row(k, str(v))
    return table


# ---- services ----------------------------------------------------------------------------------


def _set_up_logging() -> None:
    # INTELLECT_LOG_FORMAT / INTELLECT_LOG_LEVEL; a command may set up again with its own --log-level.
    setup_logging()


def service_app(help: str, **kwargs: Any) -> typer.Typer:
    """A Typer app (`no_args_is_help`) whose callback sets up logging before any of its commands."""
    app = typer.Typer(help=help, no_args_is_help=True, **kwargs)
    app.callback()(_set_up_logging)
    return app


def settings_from_flags(cls: type[S], **flags: Any) -> S:
    """`cls` with the flags that were given (not None) over environment, `.env` and defaults."""
    try:
        return cls(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        prefix = str(cls.model_config.get("env_prefix") or "")
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}"
            + (f" (flag, or env {prefix}{str(e['loc'][0]).upper()})" if e["loc"] else "")
            for e in exc.errors()
        )
        err.print(f"[red]invalid setting:[/red] {problems}", highlight=False)
        raise typer.Exit(2) from None


_SECRET_NAMES = ("key", "token", "password", "secret", "passphrase")


def add_settings_commands(
    app: typer.Typer, cls: type[S], service: str, token_file: Callable[[S], Path]
) -> None:
    """`admin-token` and `show-config`, the two commands every service with an admin API shares
    (`cls`: the service's settings, with a `state_dir` field; `token_file`: where its token lives)."""
    prefix = str(cls.model_config.get("env_prefix") or "INTELLECT_")

    @app.command("admin-token")
    def admin_token(
        state_dir: Path = typer.Option(None, help=f"the {service}'s state directory"),
        as_json: bool = typer.Option(False, "--json", help="print JSON"),
    ) -> None:
        """Print the admin bearer token the service created on its first start (never makes one)."""
        from intellect.auth import read_admin_token

        path = token_file(settings_from_flags(cls, state_dir=state_dir))
        try:
            token = read_admin_token(path, service)
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        typer.echo(json.dumps({"token": token, "file": str(path)}) if as_json else token)

    @app.command("show-config")
    def show_config(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
        """The effective settings (flags > env > .env > defaults); keys, tokens and passwords hidden."""
        data = settings_from_flags(cls).model_dump(mode="json")
        for name in data:
            if data[name] and any(name.endswith(s) for s in _SECRET_NAMES):
                data[name] = "***"
        if as_json:
            typer.echo(json.dumps(data, indent=2))
            return
        table = Table("setting", "value", title=f"{service} settings ({prefix}* env)")
        for name, value in data.items():
            table.add_row(name, str(value))
        Console().print(table)


def checkpoint_flags(values: list[str], first: int = 0) -> dict[int, Path]:
    """`--checkpoint STEP=PATH` flags (check and calibrate): step → an existing file; STEP >= first."""
    steps: dict[int, Path] = {}
    for value in values:
        step, sep, path = value.partition("=")
        if not sep or not step.isdigit() or int(step) < first or not path:
            raise typer.BadParameter(
                f"--checkpoint {value!r}: use STEP=PATH with STEP >= {first}, e.g. 3=ckpt/step_3.safetensors"
            )
        if not Path(path).is_file():
            raise typer.BadParameter(f"--checkpoint {value!r}: {path} does not exist")
        steps[int(step)] = Path(path)
    return steps
