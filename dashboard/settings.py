"""Dashboard settings: flags, then `INTELLECT_DASHBOARD_*` environment variables, then `.env`."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from intellect.settings import IntellectSettings


class DashboardSettings(IntellectSettings):
    # Next to a devnet, its settings (written by `intellect devnet up`) fill in what is unset; `.env`
    # (read after it) and the environment win.
    model_config = SettingsConfigDict(
        env_prefix="INTELLECT_DASHBOARD_", env_file=(".devnet/dashboard.env", ".env"), extra="ignore"
    )

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8095, ge=0, le=65535, description="port (0: a free one)")
    orchestrator_url: str | None = Field(None, description="orchestrator base URL")
    orchestrator_token_file: Path | None = Field(
        None, description="the orchestrator's admin token; kept server-side, never sent to browsers"
    )
    validator_url: str | None = Field(None, description="validator API base URL (verdicts)")
    trainer_url: str | None = Field(None, description="trainer base URL (step counter, reward history)")
    trainer_dir: Path | None = Field(
        None, description="the trainer's output folder: its step manifests give the reward curve when the "
        "trainer does not answer (after a run)",
    )
    rpc_url: str | None = Field(None, description="chain RPC, for stake and payouts")
    deployment: Path | None = Field(None, description="deployment.json of the contracts")
    pool_id: int = Field(1, ge=1)
    refresh_seconds: float = Field(3.0, gt=0, description="how often the page refreshes itself")
    timeout_seconds: float = Field(3.0, gt=0, description="per upstream request")
