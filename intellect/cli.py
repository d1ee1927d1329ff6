"""What every service's command line starts from: a Typer app that sets up logging once for whichever
command runs (the one logging set-up per entry point, never on import), and settings built from flags
over environment and `.env`, where a bad value exits with code 2 naming the setting."""

from __future__ import annotations

from typing import Any, TypeVar

import typer
from pydantic import ValidationError
from pydantic_settings import BaseSettings
from rich.console import Console

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
