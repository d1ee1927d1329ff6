"""Orchestrator settings: flags override `INTELLECT_ORCH_*` environment variables, then defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from intellect.keyfiles import KeySecret
from intellect.settings import IntellectSettings, default_home
from orchestrator.groups.failures import FAILED_COOLDOWN_SECONDS
from orchestrator.groups.topology import Topology, parse_topology_name


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
    manager_key: KeySecret | None = Field(
        default=None, description="pool manager's private key, raw (devnets) or file:PATH (a 0600 file)"
    )
    manager_keystore: Path | None = Field(default=None, description="keystore of the pool manager's key")

    heartbeat_interval_seconds: float = Field(default=5.0, gt=0)
    heartbeat_ttl_seconds: float = Field(default=15.0, gt=0)
    check_interval_seconds: float = Field(default=5.0, gt=0)
    miss_threshold: int = Field(default=2, ge=1)
    invite_interval_seconds: float = Field(default=10.0, gt=0, description="discovery poll period")
    invite_timeout_seconds: float = Field(default=60.0, gt=0, description="WaitingForHeartbeat → re-invite")
    invite_valid_seconds: int = Field(default=3600, ge=60, description="on-chain expiry of an invite")
    invite_max_backoff_seconds: float = Field(default=600.0, gt=0)
    eject_dead_nodes: bool = True
    hardware_challenge: bool = Field(
        default=True, description="challenge each node's hardware before inviting it and again at random "
        "(docs/hardware.md): a wrong answer is refused an invite; groups are placed by what was proven",
    )  # fmt: skip
    hardware_n: int = Field(default=1024, ge=16, le=8192, description="the challenge's matrices are n × n")
    hardware_precision: Literal["float32", "float16", "bfloat16"] = Field(
        default="float32", description="precision the challenge's product is computed and checked in",
    )  # fmt: skip
    hardware_timeout_seconds: float = Field(default=60.0, gt=0, description="for a commitment, then a reveal")
    hardware_recheck_seconds: float = Field(
        default=3600.0, ge=0, description="mean time between random re-challenges of a pool member "
        "(exponentially distributed, so no node knows when; 0: only before the invite)",
    )  # fmt: skip
    round_trip_seconds: float = Field(
        default=300.0, ge=0, description="how often each node measures its round trips to up to 16 other "
        "nodes' peer inboxes (what groups are placed by, docs/hardware.md); 0: never",
    )  # fmt: skip
    # Dead (no work, its group dissolved) comes at most `dead_within_seconds` after the last beat; the
    # on-chain ejection waits longer, so a link that drops for a minute costs an honest node nothing
    # on chain (a Dead node that heartbeats again is Healthy at the next check). docs/orchestrator.md.
    eject_after_seconds: float = Field(
        default=120.0, ge=0, description="a Dead node is ejected on chain once its last heartbeat is this "
        "old (0: as soon as it is Dead)",
    )
    http_timeout_seconds: float = Field(default=10.0, gt=0)
    http_retries: int = Field(default=3, ge=1)
    max_skew_seconds: int = 60
    admin_signers: list[str] = Field(
        default_factory=list, description="addresses whose signed requests may use the admin API (besides "
        "the pool manager's key), e.g. a trainer's; JSON list in INTELLECT_ORCH_ADMIN_SIGNERS",
    )
    heartbeat_rate_limit_per_minute: int = Field(default=120, ge=1)
    run_background_loops: bool = Field(default=True, description="off for extra API-only replicas")
    refuse_unjudged: bool = Field(
        default=False, description="refuse (422) a task no installed workload judges (it names none and no "
        "plug-in claims its program), instead of accepting it marked unjudged",
    )  # fmt: skip

    # ---- uploads and storage (docs/storage-and-groups.md) ----
    storage_dir: Path | None = Field(default=None, description="local storage root (state_dir/storage)")
    storage_secret: SecretStr | None = Field(
        default=None, description="HMAC key of storage URLs and (a sub-key) of node groups' secrets; "
                                  "default generated in state_dir (share it across replicas)")
    s3_bucket: str | None = Field(default=None, description="store uploads in this S3 bucket, not on disk")
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_prefix: str = ""
    upload_max_bytes: int = Field(default=1 << 30, ge=1, description="largest file a node may upload")
    upload_rate_limit_per_minute: int = Field(default=60, ge=1, description="requests per node a minute")
    upload_url_ttl_seconds: int = Field(default=900, ge=1)
    upload_grace_seconds: int = Field(
        default=600, ge=0,
        description="a node that worked on a task may still upload its files this long after the task "
        "was deleted (files in flight when a run ends are paid, not refused)",
    )
    download_url_ttl_seconds: int = Field(default=300, ge=1)

    # ---- node groups ----
    topologies: list[Topology] = Field(default_factory=list, description="explicit topology configs")
    topology_names: list[str] = Field(default_factory=list, description='parsed names, e.g. ["2x640GB"]')
    groups_interval_seconds: float | None = Field(
        default=None, gt=0, description="group reconcile period; default check_interval_seconds")
    # A member whose task failed for good dissolves its group; its node is then kept out of groups for
    # that task this long, or the next pass would re-form the same group and watch it fail again.
    group_failed_cooldown_seconds: float = Field(
        default=FAILED_COOLDOWN_SECONDS, ge=0, description="a node whose group task failed for good is "
        "not grouped for that task again until this long after the failure (0: at once)",
    )  # fmt: skip

    @model_validator(mode="after")
    def _ttl_covers_interval(self) -> OrchestratorSettings:
        if self.heartbeat_ttl_seconds < self.heartbeat_interval_seconds:
            raise ValueError("heartbeat_ttl_seconds must be at least heartbeat_interval_seconds")
        return self

    @model_validator(mode="after")
    def _topologies_parse(self) -> OrchestratorSettings:
        for name in self.topology_names:
            parse_topology_name(name)  # a bad name fails at start, naming the setting
        return self

    def topology_configs(self) -> dict[str, Topology]:
        """Configured topologies by name (explicit configs win over parsed names)."""
        found = {t.name: t for t in map(parse_topology_name, self.topology_names)}
        return found | {t.name: t for t in self.topologies}

    @property
    def admin_token_file(self) -> Path:
        return self.state_dir / "admin-token"

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.state_dir / 'orchestrator.db'}"

    @property
    def effective_storage_dir(self) -> Path:
        return self.storage_dir or self.state_dir / "storage"

    @property
    def effective_groups_interval(self) -> float:
        return self.groups_interval_seconds or self.check_interval_seconds

    @property
    def dead_within_seconds(self) -> float:
        """A node that stops is Dead at most this long after its last heartbeat: the TTL, then
        `miss_threshold` checks (the first of which may come a whole period late). Defaults: 25 s."""
        return self.heartbeat_ttl_seconds + self.miss_threshold * self.check_interval_seconds

    @property
    def effective_public_url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"
