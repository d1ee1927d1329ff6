"""A calibration per model, made by a command (issue 43.1, 43.2, 43.4; workloads/inference/judge/calibrate.py,
workloads/inference/judge/limits.py): `intellect-validator calibrate` measures a model's honest files and
cheats and
writes a record the validator then judges that model with; the limit rules hold on synthetic
samples; the shipped records of the bench shapes match what the pinned torch builds, and on one of
them honest files pass and a cheat is slashed by the full pipeline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from intellect.wire.verdicts import Submission
from intellect.workloads import MemorySeenStore
from validator.cli import app
from workloads.inference.judge.calibrate import CHEATS
from workloads.inference.judge.calibration import ENV, find_calibration, model_id
from workloads.inference.judge.checks.model import FileStats
from workloads.inference.judge.file_judge import InferenceJudge
from workloads.inference.judge.limits import Sample, derive
from workloads.inference.judge.thresholds import ValidationThresholds
from workloads.inference.settings import InferenceSettings
from workloads.inference.task import TaskSettings
from workloads.inference.workload import InferenceWorkload
from workloads.model.loading import ModelCheckpoints, resolve
from workloads.model.shapes import build_model_dir

NODE = "0x5aeda56215b167893e80b4fe645ba6d5bab767de"


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """A copy of the tiny model that no shipped record knows (its config differs), calibrated by the
    command with two training steps: (model folder, records folder, the record as JSON)."""
    root = tmp_path_factory.mktemp("calibrate")
    model = root / "other-tiny"
    shutil.copytree(resolve("tiny"), model)
    config = json.loads((model / "config.json").read_text())
    config["intellect_note"] = "a model of its own"
    (model / "config.json").write_text(json.dumps(config))
    records = root / "records"
    result = CliRunner().invoke(app, [
        "calibrate", str(model), "--quick", "--max-new-tokens", "16", "--train-steps", "2",
        "--out", str(records / "other.json"), "--work-dir", str(root / "work"),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    return model, records, json.loads((records / "other.json").read_text())


def test_the_command_measures_honest_files_and_every_cheat(calibrated: tuple[Path, Path, dict]) -> None:
    model, _, record = calibrated
    measured = record["measured"]
    assert record["model_id"] == model_id(model) and record["name"] == "other-tiny"
    # base weights at generation batches 1 and 16, 1 and 2 threads; one-token rows; two checkpoints
    assert measured["honest_files"] == 4 + 1 + 2
    fp = measured["false_positives"]
    assert fp["recomputations"] == measured["honest_files"] * 2  # prefill batch 1 and 64
    assert fp["failing"] == 0 and fp["per_rule"] == {}, fp
    caught = measured["cheats_caught"]
    assert set(caught) == set(CHEATS)
    for kind in ("int8 weights", "noise 1e-2", "noise 1e-3", "another seed", "perturbed layer"):
        assert caught[kind]["strong"] == 1, (kind, caught)
    assert caught["fp16 weights"]["none"] == 0, caught  # on the tiny model fp16 is told apart
    stats = {row["statistic"]: row for row in measured["statistics"]}
    mean = stats["file TOPLOC mantissa mean"]
    assert mean["worst_honest"] < mean["limit"]
    assert mean["limit"] == record["thresholds"].get("file_max_mant_mean", mean["limit"])


def test_the_validator_judges_that_model_with_its_record(
    calibrated: tuple[Path, Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the record the model is uncalibrated (a cheat is not paid, never slashed); with its
    folder in INTELLECT_VALIDATOR_CALIBRATIONS the record's limits judge, and a cheat is slashed."""
    model, records, record = calibrated
    task = TaskSettings(model=str(model), batch_size=4, n=4, max_new_tokens=16, target_lengths=[8])
    workload = InferenceWorkload(InferenceSettings(
        node_address=NODE, output_dir=tmp_path, model=str(model), batch_size=4, n=4, max_new_tokens=16,
        target_lengths=[8], cheat="perturbed-model",
    ))  # fmt: skip
    path = Path(workload.run_batch().path)  # type: ignore[union-attr]
    monkeypatch.delenv(ENV, raising=False)
    assert find_calibration(model) is None
    monkeypatch.setenv(ENV, str(records))
    pipeline = InferenceJudge(task, MemorySeenStore(), ModelCheckpoints(str(model)))
    assert pipeline.calibration is not None and pipeline.calibration.model_id == record["model_id"]
    for key, value in record["thresholds"].items():
        assert getattr(pipeline.thresholds, key) == value
    verdict = pipeline.judge(path, Submission(node=NODE))
    assert verdict.verdict == "invalidate", verdict.reasons


def test_a_model_without_local_weights_is_refused_with_the_fix(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["calibrate", "Qwen/Qwen2-0.5B", "--out", str(tmp_path / "x.json")])
    assert result.exit_code == 2 and "config.json and single model.safetensors" in result.output
    result = runner.invoke(app, ["calibrate", "tiny", "--checkpoint", "0=nowhere.safetensors"])
    assert result.exit_code == 2 and "STEP=PATH with STEP >= 1" in result.output
    assert not (tmp_path / "x.json").exists()


def sample(mant: float, share: float, exps: int = 3, chunks: int = 16, setting: str = "honest") -> Sample:
    stats = FileStats(chunks=chunks, mant_mean=mant, median_chunk_share=share, max_exp_mismatches=exps,
                      lp_tokens=100, lp_abs_sum=0.4, lp_signed_sum=0.01, rows=4)  # fmt: skip
    return Sample(setting=setting, prefill=64, stats=stats)


def test_limits_follow_the_rules_written_in_limits_py() -> None:
    honest = [sample(0.6, 0.2), sample(0.8, 0.7, exps=10), sample(5.0, 1.0, chunks=4)]  # last: too few chunks
    far = derive(honest, [sample(9.0, 1.0, setting="noise")])
    # no cheat within reach: 1.5 x the worst judged honest file (the 4-chunk file is not judged)
    assert far.thresholds["file_max_mant_mean"] == pytest.approx(1.2)
    # share: 0.7 + 0.375 >= 1, so the statistic is off (1.0) for this model
    assert far.thresholds["file_max_median_chunks"] == 1.0
    assert far.thresholds["chunk_max_exp_mismatches"] == 20  # twice the worst honest row
    # a cheat just above the honest worst pulls the limit between them, never under 1.25 x honest
    near = derive(honest, [sample(1.1, 1.0, setting="fp16")])
    assert near.thresholds["file_max_mant_mean"] == pytest.approx(1.049)  # sqrt(1.25 * 0.8 * 1.1), rounded up
    quiet = derive([sample(0.1, 0.0)], [])
    assert quiet.thresholds["file_max_median_chunks"] == 0.375  # three chunks of an 8-chunk file above 0
    assert "chunk_max_exp_mismatches" not in quiet.thresholds  # never below the default
    derived = ValidationThresholds().model_copy(update=quiet.thresholds)
    assert derived.file_max_mant_mean == pytest.approx(0.15)


@pytest.mark.parametrize("shape", ["tiny-long", "small", "medium"])
def test_shipped_records_match_the_shapes_the_pinned_torch_builds(shape: str, tmp_path: Path) -> None:
    folder = build_model_dir(shape, tmp_path)
    record = find_calibration(folder)
    fix = f"rerun bench/calibrate_shapes.py --shape {shape} --write"
    assert record is not None and record.name == shape, fix


def test_on_the_small_shape_honest_files_pass_and_a_perturbed_layer_is_slashed(tmp_path: Path) -> None:
    model = build_model_dir("small", tmp_path / "models")
    verdicts = {}
    for batch, cheat in ((1, "none"), (16, "none"), (16, "perturbed-model")):
        out = tmp_path / f"{cheat}-{batch}"
        workload = InferenceWorkload(InferenceSettings(
            node_address=NODE, output_dir=out, model=str(model), batch_size=batch, n=4, max_new_tokens=32,
            cheat=cheat,
        ))  # fmt: skip
        path = Path(workload.run_batch().path)  # type: ignore[union-attr]
        task = TaskSettings(model=str(model), batch_size=batch, n=4, max_new_tokens=32)
        pipeline = InferenceJudge(task, MemorySeenStore(), ModelCheckpoints(str(model)))
        assert pipeline.calibration is not None
        verdicts[(batch, cheat)] = pipeline.judge(path, Submission(node=NODE))
    expected_verdicts = {(1, "none"): "accept", (16, "none"): "accept", (16, "perturbed-model"): "invalidate"}
    for key, expected in expected_verdicts.items():
        assert verdicts[key].verdict == expected, (key, verdicts[key].reasons)
