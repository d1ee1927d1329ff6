"""Discovery settings: flags override `INTELLECT_DISCOVERY_*` environment variables, then defaults."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from intellect.settings import IntellectSettings, default_home


class DiscoverySettings(IntellectSettings):
    model_config = SettingsConfigDict(env_prefix="INTELLECT_DISCOVERY_", env_file=".env", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8089
    redis_url: str | None = Field(default=None, description="None: start the embedded redis-server")
    rpc_url: str = "http://127.0.0.1:8545"
    deployment: Path = Field(default_factory=lambda: default_home() / "deployment.json")
    state_dir: Path = Field(default_factory=lambda: default_home() / "discovery")
    pool_id: int | None = Field(default=None, description="check uploads against this pool's requirements")
    max_nodes_per_ip: int = Field(default=8, ge=1)
    require_whitelisted_provider: bool = True
    sync_interval_seconds: float = Field(default=30.0, gt=0)
    record_ttl_seconds: int = Field(default=86_400, ge=60)
    chain_cache_seconds: float = Field(default=15.0, ge=0, description="cache of pool/validator lookups")
    max_skew_seconds: int = 60
    rate_limit_per_minute: int = 120

    @property
    def admin_token_file(self) -> Path:
        return self.state_dir / "admin-token"
