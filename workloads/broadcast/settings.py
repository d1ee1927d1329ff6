"""Settings shared by origin, relay and client: CLI flags override `INTELLECT_BROADCAST_*` environment
variables, which override these defaults. Defaults suit production (shardcast-sized shards); tests
pass small shard sizes explicitly."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from workloads.broadcast.manifest import DEFAULT_SHARD_SIZE


class BroadcastSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="INTELLECT_BROADCAST_", extra="ignore")

    shard_size: int = Field(DEFAULT_SHARD_SIZE, ge=1, description="bytes per shard (shardcast: 50,000,000)")
    keep: int = Field(5, ge=1, description="versions kept on disk by an origin or relay")
    poll_seconds: float = Field(1.0, gt=0, description="how often a relay asks its upstream for versions")
    relay_concurrency: int = Field(4, ge=1, description="shards a relay fetches from upstream at once")
    shard_wait_seconds: float = Field(
        10.0, ge=0, description="a relay holds a request for a listed shard this long while it arrives"
    )
    probe_size: int = Field(1 << 20, ge=1, description="bytes of /data1.bin, shardcast clients' speed probe")
    client_concurrency: int | None = Field(
        None, ge=1, description="shards a client downloads at once (default: by relays and cores)"
    )
    timeout_seconds: float = Field(30.0, gt=0, description="per-request read timeout")
