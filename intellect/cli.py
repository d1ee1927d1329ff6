"""What every service's command line starts from: a Typer app that sets up logging once for whichever
command runs (the one logging set-up per entry point, never on import), and settings built from flags
over environment and `.env`, where a bad value exits with code 2 naming the setting; and the
`admin-token` / `show-config` commands of every service with an admin API."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from pydantic import ValidationError
from pydantic_settings import BaseSettings
from rich.console import Console
from rich.table import Table

from intellect.logs import setup_logging

S = TypeVar("S", bound=BaseSettings)
_err = Console(stderr=True, soft_wrap=True)


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
        _err.print(f"[red]invalid setting:[/red] {problems}", highlight=False)
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
