"""Logging set-up for every service: one function, called by each entry point, never on import.

The choice: structlog over stdlib. Every module of ours logs with `structlog.get_logger(name)`, an
event name plus key-value context (`log.warning("heartbeat failed", error=...)`); third-party
libraries (uvicorn, httpx, web3) log through stdlib, and their records are routed through the same
handler and rendered by the same structlog processors, so every line on stderr has one shape. stdout
stays clean for `--json` output. Tests read our events with `structlog.testing.capture_logs()`.

The format comes from `INTELLECT_LOG_FORMAT` (`json`, the default, or `console`), the level from
`INTELLECT_LOG_LEVEL` (default `info`); an entry point's explicit flag wins over the environment.
`import intellect` configures nothing (tests check it): a library user keeps their own logging.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog

LogFormat = Literal["json", "console"]

_HANDLER_NAME = "intellect"


def _settings() -> tuple[str, LogFormat]:
    """(level, format) from `INTELLECT_LOG_*` in the environment or `.env`. pydantic-settings is imported
    here, not at module level: a quick entry point (`intellect-broadcast fetch`) routes logs without it."""
    from pydantic_settings import BaseSettings, SettingsConfigDict

    class LogSettings(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="INTELLECT_LOG_", env_file=".env", extra="ignore")

        format: LogFormat = "json"
        level: str = "info"

    settings = LogSettings()
    return settings.level, settings.format


def setup_logging(level: str | None = None, fmt: LogFormat | None = None) -> None:
    """Route structlog and stdlib logs to stderr as JSON lines or console text; safe to call twice."""
    if level is None or fmt is None:
        default_level, default_fmt = _settings()
        level, fmt = level or default_level, fmt or default_fmt
    route_logs(level, fmt)


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to `sys.stderr` as it is when a line is emitted, not as it was at set-up: a process that
    swaps its stderr (a CLI run inside a test runner, which closes the swapped stream afterwards) would
    otherwise have every later line fail with "I/O operation on closed file"."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        """StreamHandler's own set-up assigns a stream: always stderr here."""


def route_logs(level: str, fmt: str) -> None:
    """The set-up itself, from explicit values (no settings read)."""
    level_name = level.upper()
    numeric = logging.getLevelName(level_name)
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level_name!r}: use debug, info, warning or error")
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if fmt == "console"
        else structlog.processors.JSONRenderer()
    )
    shared: list[structlog.typing.Processor] = [
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso"),
    ]
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, *shared,
                    structlog.stdlib.PositionalArgumentsFormatter(),
                    structlog.processors.format_exc_info,
                    structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    handler = _StderrHandler()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    ))
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    logging.getLogger("httpx").setLevel(max(numeric, logging.WARNING))  # one line per request is noise


configure_logging = setup_logging
"""Former name, kept for callers on other branches."""
