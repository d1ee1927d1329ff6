"""Rollout files: one parquet file per batch with a fixed, versioned schema.

The schema is exact: readers (validators, the trainer) reject any file whose columns, order, types
or schema version differ, rather than guessing. File metadata also carries what a validator needs to
reproduce the batch's prompt selection and seeds (node address, step, batch counter), and the device
type the batch was generated on (`BatchInfo.device`: the validator judges a file's recomputation under
the calibration record's part for that device).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from intellect.digests import sha256_file

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
# A generating device as a file states it: a torch device type ("cpu", "cuda", "mps", ...), no index.
DEVICE_PATTERN = r"^[a-z][a-z0-9_]{0,15}$"


class RolloutSchemaError(ValueError):
    pass


class RolloutTooLarge(RolloutSchemaError):
    """The file declares more than its task allows (rows, tokens, bytes once decompressed): refused
    from its footer, before any data is read or decompressed."""


PROOF_BYTES_PER_CHUNK = 258  # a TOPLOC chunk proof (32 positions); bounds are set at twice this


@dataclass(frozen=True)
class FileLimits:
    """What one rollout file of a task may hold, checked against the parquet footer before reading.

    A parquet file's footer states, per column chunk, its values and its decompressed size; a file a
    few KB long can state (and hold) gigabytes of repetitive data. Honest files of a task are bounded
    by its shape, so everything beyond these limits is refused by what the footer says. The byte
    budget is a generous multiple (`slack`) of the largest honest file: a real file stays far below."""

    max_rows: int
    max_tokens_per_row: int  # prompt + output tokens
    max_new_tokens: int
    max_text_bytes: int = 256  # task_type, problem_id
    max_row_groups: int = 64
    max_footer_bytes: int = 1 << 20
    slack: int = 4

    @classmethod
    def for_task(cls, batch_size: int, n: int, max_prompt_tokens: int, max_new_tokens: int) -> FileLimits:
        return cls(max_rows=batch_size * n, max_tokens_per_row=max_prompt_tokens + max_new_tokens,
                   max_new_tokens=max_new_tokens)  # fmt: skip

    @property
    def max_proof_bytes_per_row(self) -> int:
        return 2 * PROOF_BYTES_PER_CHUNK * (self.max_new_tokens // 32 + 1)

    def column_values(self, name: str) -> int:
        """The most leaf values a column may hold (list columns: one per token, plus one per row)."""
        per_row = {"input_tokens": self.max_tokens_per_row, "output_tokens": self.max_new_tokens,
                   "output_logprobs": self.max_new_tokens}.get(name, 1)  # fmt: skip
        return self.max_rows * (per_row + 1)

    def column_bytes(self, name: str) -> int:
        """The most bytes a column may take decompressed (values, offsets, levels), with slack."""
        values = 16 * (self.column_values(name) // self.max_rows)
        per_row = {"proofs": self.max_proof_bytes_per_row, "task_type": self.max_text_bytes,
                   "problem_id": self.max_text_bytes}.get(name, values)  # fmt: skip
        return self.slack * (self.max_rows * (per_row + 64) + 4096)


def check_footer(path: str | Path, limits: FileLimits) -> None:
    """Refuse a file whose footer declares more than `limits` allow (raises `RolloutTooLarge`), or
    whose footer cannot be read. Reads only the footer (itself bounded first)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size < 12:
            raise RolloutSchemaError(f"{size} bytes is not a parquet file")
        f.seek(size - 8)
        tail = f.read(8)
    if tail[4:] != b"PAR1":
        raise RolloutSchemaError("not a parquet file (no PAR1 magic at its end)")
    footer = int.from_bytes(tail[:4], "little")
    if footer > min(limits.max_footer_bytes, size - 12):
        raise RolloutTooLarge(f"footer of {footer} bytes (file: {size}; limit {limits.max_footer_bytes})")
    try:
        meta = pq.ParquetFile(path).metadata
    except (pa.ArrowException, OSError) as exc:
        raise RolloutSchemaError(f"the parquet footer cannot be read: {exc}") from None
    if meta.num_row_groups > limits.max_row_groups:
        raise RolloutTooLarge(f"{meta.num_row_groups} row groups (limit {limits.max_row_groups})")
    if meta.num_rows > limits.max_rows:
        raise RolloutTooLarge(f"{meta.num_rows} rows declared; the task's batch has {limits.max_rows}")
    if meta.num_columns != len(COLUMNS):
        raise RolloutSchemaError(f"{meta.num_columns} columns; the schema has {len(COLUMNS)}")
    values: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            col = group.column(c)
            name = str(col.path_in_schema).split(".")[0]
            values[name] = values.get(name, 0) + int(col.num_values)
            sizes[name] = sizes.get(name, 0) + int(col.total_uncompressed_size)
    for name in values:
        if name not in COLUMNS:
            raise RolloutSchemaError(f"unknown column {name!r}")
        if values[name] > limits.column_values(name):
            raise RolloutTooLarge(f"column {name!r} declares {values[name]} values; at most "
                                  f"{limits.column_values(name)} fit the task's shape")  # fmt: skip
        if sizes[name] > limits.column_bytes(name):
            raise RolloutTooLarge(f"column {name!r} declares {sizes[name]} bytes decompressed; at most "
                                  f"{limits.column_bytes(name)} fit the task's shape")  # fmt: skip


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
                f"output_logprobs has {len(self.output_logprobs)} values for {len(self.output_tokens)} "
                "output tokens"
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
    # The task the batch was made for (the worker's INTELLECT_TASK_ID): it salts the batch's plan, so
    # two tasks of one pool never plan the same prompts and seeds for a node's (step, counter), and a
    # validator binds the file to the task it was uploaded for. "" outside a task (local runs, tests).
    task_id: str = Field(default="", max_length=128)
    # Where the batch was generated: the torch device type the workload ran on ("cuda", never "cuda:1").
    # The validator judges the file's recomputation under the calibration record's part for the task's
    # backend on this device (workloads/inference/judge/calibration.py). A file written before the field
    # existed reads as "cpu": every part those files were judged by was measured on the CPU. A value
    # outside the pattern makes the metadata invalid (the file is malformed, as with any other field).
    device: str = Field(default="cpu", pattern=DEVICE_PATTERN, description="the generating device's type")


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


def read_table(path: str | Path, limits: FileLimits | None = None) -> tuple[pa.Table, BatchInfo]:
    """Read a rollout file, validating the schema exactly (a RolloutSchemaError names what differs).
    With `limits` (validators: the task's shape), the footer is checked first: nothing beyond them
    is ever decompressed."""
    if limits is not None:
        check_footer(path, limits)
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise RolloutSchemaError(f"{path} is not a readable parquet file: {exc}") from exc
    check_schema(schema)
    info = batch_info(schema, path)
    table = pq.read_table(path)
    if limits is not None:
        check_decoded(table, limits)
    return table, info


def batch_info(schema: pa.Schema, path: str | Path) -> BatchInfo:
    """The file's `BatchInfo` from its schema's metadata (a RolloutSchemaError where it is missing or
    invalid: a field out of its bounds, a device that is not a short lowercase identifier)."""
    try:
        return BatchInfo.model_validate_json((schema.metadata or {})[_META_BATCH])
    except (KeyError, ValueError) as exc:
        raise RolloutSchemaError(f"{path} lacks valid batch metadata: {exc}") from exc


def read_info(path: str | Path) -> BatchInfo:
    """Only a rollout file's `BatchInfo` (its schema checked), without reading its rows."""
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise RolloutSchemaError(f"{path} is not a readable parquet file: {exc}") from exc
    check_schema(schema)
    return batch_info(schema, path)


def check_decoded(table: pa.Table, limits: FileLimits) -> None:
    """Refuse a decoded table that holds more than `limits` allow (`RolloutTooLarge`), before any row
    becomes a Python object. The footer check sees only what the footer declares; a page header can
    understate its size and its pages still hold more. A validator reads in a memory-capped child
    (`workloads/inference/judge/reader.py`), and what the child hands the validator is bounded here, by
    the task's
    shape, not by the child's cap: before, such a file reached 1.47 GB in the validator process."""
    if table.num_rows > limits.max_rows:
        raise RolloutTooLarge(f"the file holds {table.num_rows} rows where its task allows {limits.max_rows}"
                              " (its footer said otherwise)")  # fmt: skip
    for name in COLUMNS:
        column = table.column(name)
        if column.nbytes > limits.column_bytes(name):
            raise RolloutTooLarge(f"column {name!r} decodes to {column.nbytes} bytes where its task allows "
                                  f"{limits.column_bytes(name)} (its footer said otherwise)")  # fmt: skip
        if pa.types.is_list(column.type) and len(column):
            lengths = pc.list_value_length(column)
            longest = pc.max(lengths).as_py() or 0
            per_row = limits.column_values(name) // limits.max_rows - 1
            if longest > per_row:
                raise RolloutTooLarge(f"column {name!r} has a row of {longest} values where its task "
                                      f"allows {per_row}")  # fmt: skip


def read_rollouts(path: str | Path, limits: FileLimits | None = None) -> tuple[list[Rollout], BatchInfo]:
    table, info = read_table(path, limits)
    rows = []
    for i, row in enumerate(table.to_pylist()):
        try:
            rows.append(Rollout(**row))
        except ValidationError as exc:
            raise RolloutSchemaError(f"row {i}: {_row_error(exc)}") from None
    return rows, info


def _row_error(exc: ValidationError) -> str:
    """A row's first problem as a sentence: 'output_logprobs has 31 values for 32 output tokens'."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    message = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message
