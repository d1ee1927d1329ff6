"""Worker configuration: flags override `INTELLECT_WORKER_*` environment, which overrides defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from intellect.keyfiles import KeySecret
from intellect.settings import IntellectSettings, default_home


class WorkerSettings(IntellectSettings):
    model_config = SettingsConfigDict(
        env_prefix="INTELLECT_WORKER_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    rpc_url: str = "http://127.0.0.1:8545"
    deployment: Path | None = Field(default=None, description="contracts' deployment JSON")
    discovery_url: str = "http://127.0.0.1:8089"
    pool_id: int = Field(default=1, ge=0)
    state_dir: Path = Field(default_factory=lambda: default_home() / "worker")
    api_host: str = Field(default="127.0.0.1", description="address the worker API binds to")
    api_port: int = Field(default=8091, ge=0, le=65535, description="0 picks a free port")
    advertised_ip: str | None = Field(default=None, description="IP others reach; default api_host")
    compute_units: int = Field(default=1, ge=1)
    stake: int | None = Field(default=None, ge=0, description="token base units; default: minimum")
    heartbeat_interval: float = Field(default=5.0, gt=0)
    metadata_refresh: float = Field(default=60.0, gt=0, description="seconds between discovery uploads")
    request_timeout: float = Field(default=5.0, gt=0, description="timeout of every outgoing HTTP call")
    max_skew_seconds: int = Field(default=60, ge=1)
    min_disk_mb: int = Field(default=1024, ge=0, description="below this much free disk `check` fails")
    stop_tasks_on_exit: bool = Field(
        default=False,
        description="stop and remove the task's process or container when the worker exits (devnets, "
        "compose); off, a running task is adopted by the next worker process",
    )
    task_env: dict[str, str] = Field(
        default_factory=dict,
        description="extra environment for every task this worker runs, as JSON (INTELLECT_WORKER_TASK_ENV="
        "'{\"HF_HOME\": \"/cache\"}'): it overrides the task spec's values; the worker's own "
        "INTELLECT_* bridge variables still win",
    )
    task_network: str | None = Field(
        default=None, description="Docker network for task containers: unset is the engine's default "
        "bridge; 'host' lets tasks reach services on this machine's loopback (devnets)",
    )
    task_isolation: Literal["auto", "require", "off"] = Field(
        default="auto", description="process runtime: run each task confined (its own PID and mount "
        "namespaces, a root holding only its folders and the software, user task_uid) when the worker runs "
        "as root; 'require' fails tasks that cannot be confined, 'off' runs them as the worker's user",
    )
    task_software: list[Path] = Field(
        default_factory=list, description="folders a confined task may read besides the worker's own "
        "Python environment, as JSON: another environment a task's entry point names (the vLLM "
        "backend's .venv-vllm: INTELLECT_WORKER_TASK_SOFTWARE='[\"/srv/intellect/.venv-vllm\"]')",
    )
    task_uid: int = Field(default=65534, ge=1, description="user id confined tasks run as (nobody)")
    task_gid: int = Field(default=65534, ge=1, description="group id confined tasks run as (nogroup)")
    p2p_seed: str | None = Field(
        default=None, description="value of ${WORKER_P2P_SEED} in this worker's tasks (unset: a task "
        "using it fails, naming this setting)",
    )
    benchmark: bool = Field(
        default=True, description="measure this machine's decode throughput once (worker/benchmark.py, "
        "cached per version and hardware) and report it, so groups put nodes of similar speed together",
    )
    hardware_device: str = Field(
        default="cpu", pattern=r"^(cpu|cuda|cuda:\d+)$",
        description="where this node computes the pool's hardware challenges (docs/hardware.md): cpu (numpy, "
        "float32 sums) or cuda / cuda:N (torch, in the challenge's precision); what it proves there is "
        "what groups are placed by",
    )  # fmt: skip
    p2p_port: int | None = Field(
        default=None, ge=1, le=65535,
        description="port of this node's peer-to-peer inbox (group workloads): advertised to discovery "
        "(the node before this one in its group connects to it) and the value of ${WORKER_P2P_PORT} "
        "in this worker's tasks (unset: peers are told the API port, and a task using it fails)",
    )  # fmt: skip
    p2p_bind_port: int | None = Field(
        default=None, ge=1, le=65535,
        description="where this node's group links listen when that is not the advertised p2p_port: "
        "something in front answers at p2p_port (and the port after it) and forwards here (and to the "
        "port after it): a port mapping, or a delay relay (`python -m intellect.links`, the devnet's "
        "--link-delay). Becomes ${WORKER_P2P_PORT}; unset: p2p_port",
    )  # fmt: skip
    submit_batch_files: int = Field(
        default=1, ge=1, le=256,
        description="files per submitWorkBatch transaction (1: one submitWork per file). A batch of 32 "
        "costs ~31k gas per file instead of ~181k alone (bench/gas.py); files wait for a full batch at "
        "most submit_batch_age seconds",
    )
    submit_batch_age: float = Field(
        default=30.0, gt=0, description="seconds an uploaded file waits at most for its batch to fill",
    )  # fmt: skip
    upload_interval: float = Field(
        default=0.5, gt=0, le=60, description="seconds between the uploader's passes over the queue of "
        "announced files (each pass: two SQLite reads; a file waits at most this long to go up)",
    )  # fmt: skip
    # Devnets pass keys (raw, or file:PATH to a 0600 file) instead of keystores; production uses
    # encrypted keystores in state_dir.
    provider_key: KeySecret | None = None
    node_key: KeySecret | None = None

    @field_validator("rpc_url", "discovery_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s):// URL")
        return value.rstrip("/")

    @property
    def public_ip(self) -> str:
        return self.advertised_ip or self.api_host

    @property
    def keys_dir(self) -> Path:
        return self.state_dir / "keys"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    def resolved_deployment(self) -> Path:
        """The deployment file, or a clear error naming the flag/env to set."""
        candidates = [self.deployment] if self.deployment else [self.state_dir / "deployment.json",
                                                                default_home() / "deployment.json"]
        for path in candidates:
            if path and path.exists():
                return path
        raise FileNotFoundError(
            "no deployment file: pass --deployment or set INTELLECT_WORKER_DEPLOYMENT "
            f"(looked at {', '.join(str(p) for p in candidates if p)})"
        )
