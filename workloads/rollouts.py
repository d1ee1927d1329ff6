"""Rollout files: one parquet file per batch with a fixed, versioned schema.

The schema is exact: readers (validators, the trainer) reject any file whose columns, order, types
or schema version differ, rather than guessing. File metadata also carries what a validator needs to
reproduce the batch's prompt selection and seeds (node address, step, batch counter).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA_VERSION = "1"
_META_VERSION = b"intellect.rollouts.schema_version"
_META_BATCH = b"intellect.rollouts.batch"

ROLLOUT_SCHEMA = pa.schema(
    [
        pa.field("input_tokens", pa.list_(pa.int32())),
        pa.field("output_tokens", pa.list_(pa.int32())),
        pa.field("output_logprobs", pa.list_(pa.float32())),
        pa.field("advantages", pa.float32()),
        pa.field("rewards", pa.float32()),
        pa.field("task_rewards", pa.float32()),
        pa.field("length_penalties", pa.float32()),
        pa.field("proofs", pa.binary()),
        pa.field("step", pa.int32()),
        pa.field("target_lengths", pa.int32()),
        pa.field("task_type", pa.string()),
        pa.field("seed", pa.int64()),
        pa.field("temperature", pa.float32()),
        pa.field("problem_id", pa.string()),
    ]
)
COLUMNS = tuple(ROLLOUT_SCHEMA.names)


class RolloutSchemaError(ValueError):
    pass


class Rollout(BaseModel):
    """One completion (a row)."""

    model_config = ConfigDict(frozen=True)

    input_tokens: list[int] = Field(min_length=1)
    output_tokens: list[int] = Field(min_length=1)
    output_logprobs: list[float]
    advantages: float
    rewards: float
    task_rewards: float
    length_penalties: float
    proofs: bytes
    step: int = Field(ge=0)
    target_lengths: int = Field(ge=0)
    task_type: str
    seed: int
    temperature: float = Field(ge=0)
    problem_id: str

    @field_validator("advantages", "rewards", "task_rewards", "length_penalties", "temperature")
    @classmethod
    def _f32(cls, v: float) -> float:
        # Stored as float32: round in memory too, so a row equals itself after a round trip.
        return float(np.float32(v))

    @field_validator("output_logprobs")
    @classmethod
    def _f32_list(cls, v: list[float]) -> list[float]:
        return np.asarray(v, dtype=np.float32).tolist()

    @model_validator(mode="after")
    def _lengths(self) -> Rollout:
        if len(self.output_logprobs) != len(self.output_tokens):
            raise ValueError(
                f"{len(self.output_logprobs)} logprobs for {len(self.output_tokens)} output tokens"
            )
        return self


class BatchInfo(BaseModel):
    """Per-file facts: who made the batch and which (step, batch counter) its randomness came from.
    `group_size` is n (completions per prompt): rows come in consecutive groups of that size."""

    node_address: str
    step: int = Field(ge=0)
    batch_counter: int = Field(ge=1)
    group_size: int = Field(ge=1)
    max_new_tokens: int = Field(ge=1)
    model: str = ""
    # The policy that generated the batch: the trainer step of the checkpoint (0 = base model) and
    # the sha256 of its safetensors file. A validator recomputes with exactly this checkpoint and
    # checks that it is one the step's async window allows.
    checkpoint_step: int | None = Field(default=None, ge=0)
    checkpoint_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


def to_table(rollouts: list[Rollout], info: BatchInfo) -> pa.Table:
    cols = {name: [getattr(r, name) for r in rollouts] for name in COLUMNS}
    table = pa.Table.from_pydict(cols, schema=ROLLOUT_SCHEMA)
    return table.replace_schema_metadata(
        {_META_VERSION: SCHEMA_VERSION.encode(), _META_BATCH: info.model_dump_json().encode()}
    )


def write_rollouts(path: str | Path, rollouts: list[Rollout], info: BatchInfo) -> str:
    """Write atomically (temp file + rename, so a watcher never sees half a file); returns sha256."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(to_table(rollouts, info), tmp)
    tmp.replace(path)
    return sha256_file(path)


def check_schema(schema: pa.Schema) -> None:
    version = (schema.metadata or {}).get(_META_VERSION)
    if version != SCHEMA_VERSION.encode():
        raise RolloutSchemaError(
            f"rollout schema version {version!r} is not the supported {SCHEMA_VERSION!r}"
        )
    if schema.names != ROLLOUT_SCHEMA.names:
        raise RolloutSchemaError(f"rollout columns {schema.names} differ from the expected {list(COLUMNS)}")
    for want, got in zip(ROLLOUT_SCHEMA, schema, strict=True):
        if not got.type.equals(want.type):
            raise RolloutSchemaError(f"column {want.name!r} has type {got.type}, expected {want.type}")


def read_table(path: str | Path) -> tuple[pa.Table, BatchInfo]:
    """Read a rollout file, validating the schema exactly (a RolloutSchemaError names what differs)."""
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise RolloutSchemaError(f"{path} is not a readable parquet file: {exc}") from exc
    check_schema(schema)
    try:
        info = BatchInfo.model_validate_json(schema.metadata[_META_BATCH])
    except (KeyError, ValueError) as exc:
        raise RolloutSchemaError(f"{path} lacks valid batch metadata: {exc}") from exc
    return pq.read_table(path), info


def read_rollouts(path: str | Path) -> tuple[list[Rollout], BatchInfo]:
    table, info = read_table(path)
    return [Rollout(**row) for row in table.to_pylist()], info


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
