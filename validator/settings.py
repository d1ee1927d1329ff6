"""Service settings: flags, then `INTELLECT_VALIDATOR_*` environment variables, then `.env`."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from intellect.device import DEVICE_DESCRIPTION, check_device_setting
from intellect.keyfiles import KeySecret
from intellect.settings import IntellectSettings, default_home
from intellect.workloads import DEFAULT_MAX_FILE_BYTES


class ValidatorSettings(IntellectSettings):
    model_config = SettingsConfigDict(env_prefix="INTELLECT_VALIDATOR_", env_file=".env", extra="ignore")

    host: str = Field("127.0.0.1", description="API address")
    port: int = Field(8091, ge=0, le=65535, description="API port (0: a free one)")
    rpc_url: str = "http://127.0.0.1:8545"
    deployment: Path = Field(default_factory=lambda: default_home() / "deployment.json")
    pool_ids: list[int] = Field(default_factory=lambda: [1], min_length=1, description="pools to validate")
    key: KeySecret | None = Field(
        None, description="the validator's private key, raw (devnets) or file:PATH (a 0600 file); or keystore"
    )
    keystore: Path | None = Field(None, description="keystore file of the validator's key")
    database_url: str | None = Field(None, description="SQLAlchemy URL; default SQLite in data_dir")
    data_dir: Path = Field(
        default_factory=lambda: default_home() / "validator",
        description="database, files and checkpoints; unless given, `run` uses a subfolder per chain and "
        "deployment (`chain_data_dir`), so two chains or two devnets never share a cursor or a verdict",
    )
    orchestrator_url: str = Field("http://127.0.0.1:8090", description="where files are (GET /storage/files)")
    step_url: str | None = Field(None, description="trainer step counter (GET /step) for freshness checks")
    confirmations: int = Field(0, ge=0, description="blocks below the head before an event is read")
    poll_seconds: float = Field(1.0, gt=0)
    max_file_bytes: int = Field(DEFAULT_MAX_FILE_BYTES, ge=1)
    fetch_timeout_seconds: float = Field(60.0, gt=0)
    fetch_window_seconds: float = Field(
        600.0, gt=0, description="availability window: a file the orchestrator still has no upload of this "
        "long after its submission is invalidated (withheld); capped at a third of the pool's voting window",
    )
    vote: bool = Field(True, description="send invalidation votes (off: judge and report only)")
    device: str = Field("cpu", description=DEVICE_DESCRIPTION + "; the recomputation (prefill) runs there. "
                        "Default cpu: the thresholds were calibrated there (docs/performance.md)")
    judge_attempts: int = Field(
        5, ge=1, description="tries at judging a file the validator's own checks fail on (a crash, a dead "
        "reader) before it is soft-invalidated: not paid, never slashed; the files behind it are judged "
        "meanwhile",
    )


    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        return check_device_setting(value)


def chain_data_dir(root: Path, chain_id: int, pool_contract: str, deploy_block_hash: str) -> Path:
    """The default data folder of one deployment: `<root>/<chain id>-<ComputePool address>-<8 hex of
    the deployment block's hash>`. The block hash tells apart two devnets whose contracts have the same
    addresses (a fresh anvil deploys to the same ones every time)."""
    tag = deploy_block_hash.lower().removeprefix("0x")[:8]
    return root / f"{chain_id}-{pool_contract.lower()}-{tag}"
