"""Task datasets: small shipped JSONL sets and a loader for Parquet/JSONL files (the Hugging Face
datasets on-disk formats) for real runs. Rows map onto `TaskRecord`; common alternative column
names are accepted (`task_id`/`id` for problem_id, `question` for prompt), and a JSON-encoded
`verification_info` string (as in the Genesys releases) is decoded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pydantic import ValidationError

from workloads.verifiers.records import TaskRecord

DATA_DIR = Path(__file__).resolve().parent
SHIPPED = {
    "demo": DATA_DIR / "demo.jsonl",
    "reverse": DATA_DIR / "reverse.jsonl",  # the RL demo task: string reversal only
    "math": DATA_DIR / "math.jsonl",
    "code": DATA_DIR / "code.jsonl",
}
_ALIASES = {"problem_id": ("task_id", "id"), "prompt": ("question",)}


def _record(row: dict[str, Any], where: str) -> TaskRecord:
    row = dict(row)
    for field, alts in _ALIASES.items():
        for alt in alts:
            if field not in row and alt in row:
                row[field] = row[alt]
    if isinstance(row.get("verification_info"), str):
        row["verification_info"] = json.loads(row["verification_info"])
    if "problem_id" in row:
        row["problem_id"] = str(row["problem_id"])
    try:
        return TaskRecord.model_validate(row)
    except ValidationError as exc:
        raise ValueError(f"{where}: not a task record: {exc}") from exc


def load_dataset(source: str | Path) -> list[TaskRecord]:
    """A shipped set by name ("demo", "math", "code") or a .jsonl / .parquet file or a directory of
    them (files read in sorted order, so every node sees the same indexes)."""
    path = SHIPPED.get(str(source), Path(source))
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".parquet"))
        if not files:
            raise ValueError(f"dataset directory {path} holds no .jsonl or .parquet files")
        return [r for f in files for r in load_dataset(f)]
    if not path.exists():
        raise ValueError(
            f"dataset {source!r} not found: give a shipped name {sorted(SHIPPED)} or a file path"
        )
    if path.suffix == ".parquet":
        rows = pq.read_table(path).to_pylist()
    elif path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    else:
        raise ValueError(f"dataset {path}: expected a .jsonl or .parquet file")
    records = [_record(row, f"{path}:{i + 1}") for i, row in enumerate(rows)]
    if not records:
        raise ValueError(f"dataset {path} is empty")
    return records
