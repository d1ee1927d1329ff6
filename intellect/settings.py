"""Configuration base: flags override environment, environment overrides `.env`, then defaults.

Each service subclasses `IntellectSettings` with its own `env_prefix` (e.g. `INTELLECT_ORCH_`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def default_home() -> Path:
    """Where local state lives unless configured: `$INTELLECT_HOME` or `~/.intellect`."""
    import os

    return Path(os.environ.get("INTELLECT_HOME", Path.home() / ".intellect"))


class IntellectSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="INTELLECT_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
    )
