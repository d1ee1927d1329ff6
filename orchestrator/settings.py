"""Orchestrator settings: flags override `INTELLECT_ORCH_*` environment variables, then defaults."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from intellect.settings import IntellectSettings, default_home


class OrchestratorSettings(IntellectSettings):
    model_config = SettingsConfigDict(env_prefix="INTELLECT_ORCH_", env_file=".env", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8090
    public_url: str | None = Field(default=None, description="URL workers heartbeat to; default http://host:port")
    pool_id: int = Field(default=1, ge=1)
    redis_url: str | None = Field(default=None, description="None: start the embedded redis-server")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; default SQLite in state_dir")
    rpc_url: str = "http://127.0.0.1:8545"
    deployment: Path = Field(default_factory=lambda: default_home() / "deployment.json")
    state_dir: Path = Field(default_factory=lambda: default_home() / "orchestrator")
    discovery_url: str = "http://127.0.0.1:8089"
    manager_key: SecretStr | None = Field(default=None, description="pool manager's private key (devnets)")
    manager_keystore: Path | None = Field(default=None, description="keystore of the pool manager's key")

    heartbeat_interval_seconds: float = Field(default=10.0, gt=0)
    heartbeat_ttl_seconds: float = Field(default=90.0, gt=0)
    check_interval_seconds: float = Field(default=15.0, gt=0)
    miss_threshold: int = Field(default=3, ge=1)
    invite_interval_seconds: float = Field(default=10.0, gt=0, description="discovery poll period")
    invite_timeout_seconds: float = Field(default=60.0, gt=0, description="WaitingForHeartbeat → re-invite")
    invite_valid_seconds: int = Field(default=3600, ge=60, description="on-chain expiry of an invite")
    invite_max_backoff_seconds: float = Field(default=600.0, gt=0)
    eject_dead_nodes: bool = True
    http_timeout_seconds: float = Field(default=10.0, gt=0)
    http_retries: int = Field(default=3, ge=1)
    max_skew_seconds: int = 60
    heartbeat_rate_limit_per_minute: int = Field(default=120, ge=1)
    run_background_loops: bool = Field(default=True, description="off for extra API-only replicas")

    @model_validator(mode="after")
    def _ttl_covers_interval(self) -> OrchestratorSettings:
        if self.heartbeat_ttl_seconds < self.heartbeat_interval_seconds:
            raise ValueError("heartbeat_ttl_seconds must be at least heartbeat_interval_seconds")
        return self

    @property
    def admin_token_file(self) -> Path:
        return self.state_dir / "admin-token"

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.state_dir / 'orchestrator.db'}"

    @property
    def effective_public_url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"
