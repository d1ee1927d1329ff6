"""Verdicts as users get them (issue 54.1, 54.2): honest files of a model wider than the shipped tiny
one, made by the workload's own command (`python -m workloads.inference --model DIR`), judged by
`intellect-validator check` run as a user runs it, under that model's calibration record.

Before, the inference plug-in handed its judge the tiny model's limits whatever record the task's
model had: every honest file of the `medium` shape was `invalidate` ("81% of the chunks … mantissa
median >= 1"), and the tests, which built the judge themselves, never saw it. Here:
- honest `small` files: accepted, `--json` naming the record `small` that judged them;
- the record's cheats on that shape (int8 weights, N(0, 1e-3) noise on every matrix, one perturbed
  matrix), made as `calibrate` made them: `invalidate`;
- a pool's explicit override (an env var) goes on top of the record, and each verdict names it;
- the issue's own case, an honest file of the `medium` shape (made by the same workload in-process:
  the command's start-up is paid once, for `small`): accepted under the record `medium`;
- a model nobody calibrated (the same shape, another seed): honest files accepted, a cheat not paid
  and never slashed, `judged_by` saying "uncalibrated"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workloads.inference.judge.calibrate import Grid, cheat_workload
from workloads.inference.settings import InferenceSettings
from workloads.inference.workload import InferenceWorkload
from workloads.model.shapes import build_model_dir

pytestmark = pytest.mark.slow  # other interpreters: the workload's command and the validator's
BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
NODE = "0x00000000000000000000000000000000000000a5"
BATCH = ["--batch-size", "4", "-n", "4", "--max-new-tokens", "32"]


def make(model: Path, out: Path, batches: int = 2) -> list[Path]:
    """Files written by the inference workload's command, as a worker's container runs it."""
    subprocess.run(
        [sys.executable, "-m", "workloads.inference", "--model", str(model), "--output-dir", str(out),
         "--node-address", NODE, "--max-batches", str(batches), *BATCH],
        check=True, cwd=ROOT, timeout=300, capture_output=True,
    )  # fmt: skip
    return sorted(out.glob("*.parquet"))


def check(paths: list[Path], model: Path, tmp: Path, **env: str) -> list[dict]:
    task = tmp / "task.json"
    task.write_text(json.dumps({"model": str(model), "batch_size": 4, "n": 4, "max_new_tokens": 32}))
    done = subprocess.run(
        [str(BIN / "intellect-validator"), "check", *map(str, paths), "--json", "--task", str(task)],
        cwd=tmp, timeout=300, capture_output=True, text=True, env={**os.environ, **env},
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def made_here(model: Path, out: Path) -> list[Path]:
    """One honest file made by the same workload in this process (the command's own start-up, ~8 s,
    is paid once above, for `small`)."""
    settings = InferenceSettings(model=str(model), node_address=NODE, output_dir=out, batch_size=4, n=4,
                                 max_new_tokens=32)  # fmt: skip
    workload = InferenceWorkload(settings)
    report = workload.run_batch()
    assert report is not None
    return [Path(report.path)]


def cheats(model: Path, out: Path, kinds: tuple[str, ...]) -> list[Path]:
    """One file each of the record's cheats, made as `calibrate` made them on this shape (each its own
    node: `cheat_workload` plans every folder's files for an address of its own)."""
    grid = Grid(max_new_tokens=32, completions=4)
    made = []
    for kind in kinds:
        workload = cheat_workload(str(model), kind, out / kind.replace(" ", "-"), 4, grid)
        report = workload.run_batch()
        assert report is not None
        made.append(Path(report.path))
    return made


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


def test_honest_files_are_accepted_under_their_record_and_its_cheats_are_slashed(
    models: Path, tmp_path: Path
) -> None:
    """Every file's node is its own (the cheats' are not the honest node's), so each is judged on
    its own evidence in one run of `check`."""
    small = build_model_dir("small", models)
    honest = make(small, tmp_path / "honest")
    cheating = cheats(small, tmp_path / "cheats", ("int8 weights", "noise 1e-3", "perturbed layer"))
    # a pool's explicit setting goes on top of the record, and every verdict says so
    got = check([*honest, *cheating], small, tmp_path, INTELLECT_VALIDATOR_CHUNK_MAX_EXP_MISMATCHES="17")
    assert [v["verdict"] for v in got] == ["accept"] * 2 + ["invalidate"] * 3, [v["reasons"] for v in got]
    for v in got:
        by = v["judged_by"]
        assert (by["source"], by["record"]) == ("record", "small")
        assert by["overrides"] == {"chunk_max_exp_mismatches": 17}
    # the case: an honest file of the medium shape (hidden 1024, 12 layers), whose honest
    # TOPLOC mantissa errors sit past the tiny model's limits (0.91 against 0.72): accepted
    medium = build_model_dir("medium", models)
    [v] = check(made_here(medium, tmp_path / "medium"), medium, tmp_path)
    assert v["verdict"] == "accept", v["reasons"]
    assert v["judged_by"]["record"] == "medium"


def test_a_model_nobody_calibrated_never_slashes(models: Path, tmp_path: Path) -> None:
    other = build_model_dir("small", models, seed=1)  # the same shape, other weights: no record
    honest = made_here(other, tmp_path / "honest")
    good, bad = check([*honest, *cheats(other, tmp_path / "cheats", ("perturbed layer",))], other, tmp_path)
    assert good["verdict"] == "accept", good["reasons"]
    assert good["judged_by"]["source"] == "uncalibrated" and len(good["judged_by"]["model_id"]) == 64
    assert bad["verdict"] == "soft_invalidate", bad["reasons"]
    assert all("no calibration for model" in r for r in bad["reasons"]), bad["reasons"]
