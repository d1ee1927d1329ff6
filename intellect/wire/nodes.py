"""Node metadata (what a worker tells discovery) and node states (what the orchestrator tracks)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field, field_validator

from intellect.wire.base import WireModel


class GpuSpec(WireModel):
    model: str
    count: int = Field(ge=0)
    memory_mb: int = Field(ge=0, description="memory per GPU")


class ComputeSpecs(WireModel):
    gpus: list[GpuSpec] = Field(default_factory=list)
    cpu_model: str | None = None
    cpu_cores: int = Field(ge=0)
    ram_mb: int = Field(ge=0)
    disk_free_mb: int = Field(ge=0)
    docker_available: bool = False

    @property
    def gpu_count(self) -> int:
        return sum(g.count for g in self.gpus)


class Location(WireModel):
    latitude: float = Field(ge=-90, le=90)
    longitude: float = Field(ge=-180, le=180)
    city: str | None = None
    country: str | None = None


class NodeMetadata(WireModel):
    """Uploaded (signed by the node key) to discovery; the signer must equal `node_address`."""

    node_address: str
    provider_address: str
    ip_address: str
    port: int = Field(ge=1, le=65535)
    p2p_port: int | None = Field(
        default=None, ge=1, le=65535,
        description="port of the node's peer-to-peer inbox (group workloads); None: the API port",
    )
    throughput: float | None = Field(
        default=None, ge=0, le=1e9,
        description="decode tokens/s of the worker's reference benchmark (worker/benchmark.py); groups "
                    "put nodes of similar throughput together",
    )
    compute_specs: ComputeSpecs
    location: Location | None = None
    versions: dict[str, str] = Field(default_factory=dict, description="software versions, e.g. worker")

    @field_validator("node_address", "provider_address")
    @classmethod
    def _checksum(cls, value: str) -> str:
        from eth_utils import is_address, to_checksum_address

        if not is_address(value):
            raise ValueError("not an Ethereum address")
        return to_checksum_address(value)

    @property
    def worker_url(self) -> str:
        return f"http://{self.ip_address}:{self.port}"


class OnChainFlags(WireModel):
    """What discovery last read from the ledger about a node."""

    registered: bool = False
    provider_whitelisted: bool = False
    blacklisted: bool = False
    validated: bool = False
    pool_id: int | None = None
    compute_units: int = 0


class DiscoveredNode(WireModel):
    """A discovery record: the metadata plus on-chain flags and bookkeeping."""

    metadata: NodeMetadata
    on_chain: OnChainFlags
    first_seen: datetime
    last_updated: datetime


class NodeState(StrEnum):
    DISCOVERED = "Discovered"
    WAITING_FOR_HEARTBEAT = "WaitingForHeartbeat"
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    DEAD = "Dead"
    EJECTED = "Ejected"
    BANNED = "Banned"
