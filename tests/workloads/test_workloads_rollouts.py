"""Rollout parquet files round-trip and the schema check is exact."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from intellect.digests import sha256_file
from workloads.rollouts import (
    ROLLOUT_SCHEMA,
    SCHEMA_VERSION,
    BatchInfo,
    Rollout,
    RolloutSchemaError,
    read_rollouts,
    read_table,
    to_table,
    write_rollouts,
)

INFO = BatchInfo(node_address="0xabc", step=3, batch_counter=2, group_size=2, max_new_tokens=16, model="tiny")


def rows() -> list[Rollout]:
    return [
        Rollout(
            input_tokens=[5, 6, 7],
            output_tokens=[8, 9, 1],
            output_logprobs=[-0.5, -0.25, -0.125],
            advantages=1.0 - 2 * i,
            rewards=float(1 - i),
            task_rewards=float(1 - i),
            length_penalties=0.0,
            proofs=bytes([i]) * 258,
            step=3,
            target_lengths=8,
            task_type="arithmetic",
            seed=2**62 + i,
            temperature=1.0,
            problem_id=f"demo-{i}",
        )
        for i in range(2)
    ]


def test_round_trip(tmp_path):
    path = tmp_path / "r.parquet"
    digest = write_rollouts(path, rows(), INFO)
    assert digest == sha256_file(path) and len(digest) == 64
    back, info = read_rollouts(path)
    assert back == rows()
    assert info == INFO
    assert pq.read_schema(path).metadata[b"intellect.rollouts.schema_version"] == SCHEMA_VERSION.encode()
    assert not list(tmp_path.glob(".*tmp"))  # written atomically


def _write_variant(tmp_path, table: pa.Table) -> str:
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    return str(path)


def good_table() -> pa.Table:
    return to_table(rows(), INFO)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t.drop_columns(["seed"]), "columns"),
        (lambda t: t.append_column("extra", pa.array([1, 2])), "columns"),
        (
            lambda t: t.set_column(t.schema.get_field_index("step"), "step", t["step"].cast(pa.int64())),
            "step",
        ),
        (
            lambda t: t.set_column(
                t.schema.get_field_index("output_logprobs"),
                "output_logprobs",
                t["output_logprobs"].cast(pa.list_(pa.float64())),
            ),
            "output_logprobs",
        ),
        (lambda t: t.select(list(reversed(t.column_names))), "columns"),
    ],
)
def test_wrong_schemas_are_rejected(tmp_path, mutate, message):
    table = mutate(good_table()).replace_schema_metadata(good_table().schema.metadata)
    with pytest.raises(RolloutSchemaError, match=message):
        read_table(_write_variant(tmp_path, table))


def test_missing_or_wrong_version_is_rejected(tmp_path):
    plain = good_table().replace_schema_metadata(None)
    with pytest.raises(RolloutSchemaError, match="version"):
        read_table(_write_variant(tmp_path, plain))
    meta = dict(good_table().schema.metadata)
    meta[b"intellect.rollouts.schema_version"] = b"0"
    with pytest.raises(RolloutSchemaError, match="version"):
        read_table(_write_variant(tmp_path, good_table().replace_schema_metadata(meta)))


def test_not_parquet_is_rejected(tmp_path):
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not a parquet file at all")
    with pytest.raises(RolloutSchemaError, match="not a readable parquet"):
        read_rollouts(junk)


def test_schema_constant_has_reference_columns():
    for name in [
        "input_tokens",
        "output_tokens",
        "output_logprobs",
        "advantages",
        "rewards",
        "task_rewards",
        "length_penalties",
        "proofs",
        "step",
        "target_lengths",
        "task_type",
        "seed",
        "temperature",
    ]:
        assert name in ROLLOUT_SCHEMA.names
    assert ROLLOUT_SCHEMA.field("input_tokens").type == pa.list_(pa.int32())
    assert ROLLOUT_SCHEMA.field("proofs").type == pa.binary()
