"""Structured logs for every service: JSON lines on stderr (stdout stays clean for `--json` output)."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: str = "info", json_lines: bool = True) -> None:
    logging.basicConfig(level=level.upper(), format="%(message)s", stream=sys.stderr)
    renderer = structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"), renderer
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def default_to_stderr() -> None:
    """Before any CLI configures logging (library use, tests), structlog still writes to stderr."""
    if not structlog.is_configured():
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
