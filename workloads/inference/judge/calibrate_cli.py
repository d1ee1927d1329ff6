"""`intellect-validator calibrate MODEL`: the command over workloads/inference/judge/calibrate.py.

Writes the record (JSON) where the operator says, prints what it measured as a table (or the record
with --json), and tells where to put the record so the validator finds it
(`INTELLECT_VALIDATOR_CALIBRATIONS`, workloads/inference/judge/calibration.py).
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from intellect.cli import checkpoint_flags
from intellect.logs import setup_logging
from workloads.inference.judge.calibrate import CalibrationError, Grid, calibrate, device_of
from workloads.inference.judge.calibration import (
    CPU,
    ENV,
    TORCH,
    BackendPart,
    CalibrationRecord,
    find_calibration,
    model_id,
    part_key,
    part_name,
)

console = Console()
err = Console(stderr=True, soft_wrap=True)


def calibrate_command(
    model: str = typer.Argument(
        ..., help="the model: 'tiny' (shipped) or a folder with config.json and model.safetensors"
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="record file to write (default: <name>.calibration.json)"
    ),
    name: str | None = typer.Option(
        None, "--name", help="the model's name in the record (default: the folder's)"
    ),
    quick: bool = typer.Option(
        False, "--quick", help="generation batches 1 and 16, one file a setting (minutes on a CPU for a 0.5B "
        "shape; the full grid is the one to slash on)",
    ),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", min=1, help="the task's output length"),
    files_per_setting: int | None = typer.Option(
        None, "--files-per-setting", min=1, help="honest files of each setting (default: 2, 1 with --quick); "
        "more files bound the false-positive rate tighter (the rule of three: ~3/N)",
    ),
    train_steps: int = typer.Option(
        0, "--train-steps", min=0, help="train this many GRPO steps on string reversal first and measure "
        "each checkpoint (models that learn it)",
    ),
    checkpoint: list[str] = typer.Option(
        [], "--checkpoint", help="STEP=PATH of your own training run's checkpoint, measured too (repeat)"
    ),
    work_dir: Path | None = typer.Option(
        None, "--work-dir", help="where the measured files go (default: a temp dir)"
    ),
    backend: str = typer.Option(
        "torch", "--backend", help="the generating backend whose files are measured: torch, or vllm (made in "
        "vLLM's environment, `make vllm`); not torch: the record's part for that backend, added to the "
        "model's record (--base, else the one the validator finds for the model) and every other part kept",
    ),
    device: str = typer.Option(
        "cpu", "--device", help="where the files are made: cpu, cuda, cuda:N or auto; not cpu: the record's "
        "part for the backend on that device type (vllm@cuda, torch@cuda), added like --backend's part",
    ),
    base: Path | None = typer.Option(
        None, "--base", help="the record to add the measurement to (default: the model's, where one is found)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the record as JSON"),
    pipeline: bool = typer.Option(
        False,
        "--pipeline",
        help="also measure the pipeline replay's forward limits (2- and 3-member thread groups of the "
        "model, compute-saving cheats graded) and calibrate the pipeline workload too",
    ),
) -> None:
    """Measure MODEL's honest recomputation noise and its cheats; write its calibration record.

    Honest files come from the inference workload itself (generation batches 1-64, 1 and 2 threads,
    one-token rows, checkpoints; with --backend vllm, vLLM's engine makes them; with --device, on that
    device: the part for the backend there), recomputed as validators
    do (prefill batch 1 and 64); cheats are fp16 and int8 weights, N(0, 1e-2) and N(0, 1e-3) weight
    noise, another seed and one perturbed layer. The limits follow the rules of
    workloads/inference/judge/limits.py; every honest file is judged again under them. Without a record
    for the task's model, a validator's recomputation failures are never slashed. With --pipeline, the
    pipeline replay's forward limits too (workloads/pipeline/tolerance.py)."""
    try:
        own = checkpoint_flags(checkpoint, first=1)
    except typer.BadParameter as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from None
    setup_logging(level="warning")  # the workload's and trainer's info lines would bury the progress
    grid = _grid(max_new_tokens, quick=quick, train_steps=train_steps, files_per_setting=files_per_setting,
                 device=device)  # fmt: skip
    work = work_dir or Path(tempfile.mkdtemp(prefix="intellect-calibrate-"))
    made_by = "intellect-validator calibrate " + shlex.join(sys.argv[2:] if len(sys.argv) > 2 else [model])
    progress = _stopwatch()
    try:
        found = _base_record(model, base)
        record = calibrate(model, work, grid, name=name, made_by=made_by, own=own, progress=progress,
                           pipeline=pipeline, pipeline_quick=quick, backend=backend, base=found)  # fmt: skip
        part = (backend, device_of(grid))  # what calibrate measured: the files were made there
    except CalibrationError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from None
    _write(record, out or Path(f"{record.name}.calibration.json"), part, as_json=as_json)
    _refuse_unusable(record, part, pipeline=pipeline)


def _write(record: CalibrationRecord, target: Path, part: tuple[str, str], *, as_json: bool) -> None:
    """The record to `target`, then what it measured (`_report`)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(record.model_dump_json(indent=1) + "\n")
    _report(record, target, part, as_json=as_json)


def _grid(max_new_tokens: int, *, quick: bool, train_steps: int, files_per_setting: int | None,
          device: str = "cpu") -> Grid:  # fmt: skip
    """What the options ask to measure: the quick grid or the full one, with their counts on top."""
    grid = Grid.quick(max_new_tokens) if quick else Grid(max_new_tokens=max_new_tokens)
    grid.train_steps, grid.device = train_steps, device
    if files_per_setting is not None:
        grid.files_per_setting = files_per_setting
    return grid


def _stopwatch() -> Callable[[str], None]:
    """The progress lines, each with the seconds since this was made; on stderr: --json keeps stdout for
    the record."""
    started = time.monotonic()

    def progress(message: str) -> None:
        err.print(f"[{time.monotonic() - started:6.0f} s] {message}", markup=False)

    return progress


def _base_record(model: str, base: Path | None) -> CalibrationRecord | None:
    """The record a measurement is added to: --base, else the one the validator finds for the model;
    refused where it was made on another model."""
    try:
        found = CalibrationRecord.model_validate_json(base.read_text()) if base else find_calibration(model)
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        raise CalibrationError(f"--base {base} is not a calibration record: {exc}") from None
    if found is not None and found.model_id != model_id(model):
        raise CalibrationError(f"--base {base} was made on another model ({found.model_id[:16]}…)")
    return found


def _measured(record: CalibrationRecord, part: tuple[str, str]) -> CalibrationRecord | BackendPart:
    """What this run measured: the record itself (torch on the CPU), or its part for (backend, device)."""
    return record if part == (TORCH, CPU) else record.backends[part_key(*part)]


def _report(record: CalibrationRecord, target: Path, part: tuple[str, str], *, as_json: bool) -> None:
    """The record as JSON, or what it measured as tables and where it was written."""
    if as_json:
        print(record.model_dump_json(indent=1))
        return
    measured = _measured(record, part)
    _print(record.name if part == (TORCH, CPU) else f"{record.name} ({part_name(*part)} part)",
           measured.measured, measured.thresholds)  # fmt: skip
    console.print(f"record: {target} (model_id {record.model_id[:16]}…); a validator uses it when its "
                  f"folder is in {ENV}", markup=False)  # fmt: skip
    if record.pipeline and part == (TORCH, CPU):
        _print_pipeline(record.pipeline)


def _refuse_unusable(record: CalibrationRecord, part: tuple[str, str], *, pipeline: bool) -> None:
    """Exit 1 where honest files (or honest pipeline stage-batches) fail under the derived limits: the
    record is written for a look, but no validator should slash on it."""
    if pipeline and record.pipeline["measured"]["honest"]["caught"]:
        err.print("error: honest pipeline stage-batches are guilty under the derived forward limits (see "
                  "pipeline.measured.honest); not a usable record")  # fmt: skip
        raise typer.Exit(1)
    if _measured(record, part).measured["false_positives"]["failing"]:
        err.print(
            "error: honest files fail under the derived limits (see false_positives); not a usable record"
        )
        raise typer.Exit(1)


def _print(name: str, m: dict, thresholds: dict) -> None:
    fp = m["false_positives"]
    console.print(f"{name}: {m['honest_files']} honest files, {m['honest_rows']} rows, "
                  f"{fp['recomputations']} recomputations, {fp['failing']} failing under the derived limits "
                  f"({m['seconds']} s)", markup=False)  # fmt: skip
    rows = [r for r in m["statistics"] if "limit" in r]
    table = Table(title="honest noise against the derived limits")
    for col in ("statistic", "worst honest", "limit", "honest / limit"):
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(row["statistic"], f"{row['worst_honest']:.4g}", f"{row['limit']:.4g}",
                      f"{row['honest_share_of_limit']}")  # fmt: skip
    for row in m["statistics"]:
        if "limit" not in row:
            table.add_row(row["statistic"], str(row.get("measured")), "", "")
    console.print(table)
    kinds = list(m["cheats_caught"])
    graded = Table(title="cheats: the file statistics' lowest value / limit (>= 1.25 slashes, 1-1.25 not "
                         "paid; every statistic in the record), and each file's grade")  # fmt: skip
    graded.add_column("", overflow="fold")
    for kind in kinds:
        graded.add_column(kind, overflow="fold")
    for row in rows[:2]:  # the file statistics: the model fingerprint
        graded.add_row(row["statistic"], *(str(row["cheats_over_limit"].get(k, "")) for k in kinds))
    grades = ("strong", "marginal", "none")
    graded.add_row("files slashed / not paid / missed",
                   *("/".join(str(m["cheats_caught"][k][g]) for g in grades) for k in kinds))  # fmt: skip
    console.print(graded)
    changed = json.dumps(thresholds) if thresholds else "none (the defaults hold)"
    console.print(f"limits that differ from the defaults: {changed}", markup=False)


def _print_pipeline(part: dict) -> None:
    """The pipeline part: the derived forward limits, then honest and cheating stage-batches under them."""
    limits = json.dumps(part["limits"])
    console.print(f"pipeline forward limits: {limits} ({part['seconds']} s)", markup=False)
    table = Table(title="pipeline stage-batches under the derived limits (figure / limit: the file's mean "
                        "error or offset against its limit at its size; honest: the highest, cheats: the "
                        "lowest)")  # fmt: skip
    for col in ("", "files caught", "file / limit", "windows caught", "window / limit", "worst position",
                "largest mean", "largest offset"):  # fmt: skip
        table.add_column(col, overflow="fold")
    for kind, m in part["measured"].items():
        table.add_row(kind, f"{m['caught']}/{m['files']}", str(m["file_over_limit"]),
                      f"{m['window_caught']}/{m['windows']}", str(m["window_over_limit"]),
                      str(m["worst_position"]), str(m["largest_mean"]), str(m["largest_offset"]))  # fmt: skip
    console.print(table)
