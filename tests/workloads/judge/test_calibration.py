"""No slashing on a model nobody calibrated (issue 43.3, workloads/inference/judge/calibration.py):
recomputation
failures on a model without a calibration record are at most "not paid"; exact rules still slash;
records are found by the model's content (config + weights), shipped or in the operator's folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from intellect.wire.verdicts import Submission, Verdict
from intellect.workloads import MemorySeenStore
from workloads.inference.judge.calibration import ENV, CalibrationRecord, find_calibration, model_id
from workloads.inference.judge.file_judge import InferenceJudge
from workloads.inference.settings import InferenceSettings
from workloads.inference.task import TaskSettings
from workloads.inference.workload import InferenceWorkload
from workloads.model.loading import ModelCheckpoints, resolve

NODE = "0x5aeda56215b167893e80b4fe645ba6d5bab767de"


def copy_of_tiny(dst: Path, note: str | None = None) -> Path:
    shutil.copytree(resolve("tiny"), dst)
    if note is not None:  # any change to the config (or weights) is another model to the records
        config = json.loads((dst / "config.json").read_text())
        config["intellect_note"] = note
        (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.fixture(scope="module")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_of_tiny(tmp_path_factory.mktemp("models") / "other", note="not the calibrated one")


def made_by(model: Path, out: Path, cheat: str) -> Path:
    task = task_for(model)
    workload = InferenceWorkload(InferenceSettings(
        node_address=NODE, output_dir=out, model=str(model), batch_size=task.batch_size, n=task.n,
        max_new_tokens=task.max_new_tokens, target_lengths=task.target_lengths, cheat=cheat,
    ))  # fmt: skip
    return Path(workload.run_batch().path)  # type: ignore[union-attr]


def task_for(model: Path) -> TaskSettings:
    return TaskSettings(model=str(model), batch_size=4, n=4, max_new_tokens=16, target_lengths=[8, 12])


def judge(model: Path, path: Path) -> tuple[InferenceJudge, Verdict]:
    pipeline = InferenceJudge(task_for(model), MemorySeenStore(), ModelCheckpoints(str(model)))
    return pipeline, pipeline.judge(path, Submission(node=NODE))


def test_records_are_found_by_the_models_content(tmp_path: Path, other_model: Path) -> None:
    shipped = find_calibration("tiny")
    assert shipped is not None and shipped.model_id == model_id("tiny")
    same = copy_of_tiny(tmp_path / "same")
    assert find_calibration(same) == shipped  # a copy anywhere is the same model
    assert model_id(other_model) != shipped.model_id and find_calibration(other_model) is None
    assert model_id("Qwen/Qwen2-0.5B") is None  # a hub name: no local content to match


def test_on_a_model_without_a_record_a_cheat_is_not_paid_but_never_slashed(
    tmp_path: Path, other_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Perturbed weights (N(0, 1e-2) on one matrix: slashed on the calibrated tiny model) on a model
    nobody calibrated: soft, the reason saying why. A record for it in the operator's folder (the
    validator's own measurement) makes the same file a slash again."""
    monkeypatch.delenv(ENV, raising=False)
    path = made_by(other_model, tmp_path / "perturbed", "perturbed-model")
    pipeline, verdict = judge(other_model, path)
    assert pipeline.calibration is None
    assert verdict.verdict == "soft_invalidate", verdict.reasons
    assert verdict.reasons and all("no calibration for model" in r for r in verdict.reasons), verdict.reasons

    folder = tmp_path / "records"
    folder.mkdir()
    record = CalibrationRecord(model_id=model_id(other_model) or "", name="other", made_by="this test")
    (folder / "other.json").write_text(record.model_dump_json())
    (folder / "notes.json").write_text('{"not": "a record"}')  # ignored
    monkeypatch.setenv(ENV, str(folder))
    pipeline, verdict = judge(other_model, path)
    assert pipeline.calibration == record
    assert verdict.verdict == "invalidate", verdict.reasons


def test_exact_rules_slash_on_any_model(tmp_path: Path, other_model: Path) -> None:
    """A forged reward does not depend on the model's numerics: slashed without a record."""
    path = made_by(other_model, tmp_path / "forged", "forged-reward")
    pipeline, verdict = judge(other_model, path)
    assert pipeline.calibration is None
    assert verdict.verdict == "invalidate", verdict.reasons
    assert not any("no calibration" in r for r in verdict.reasons)


def test_one_place_resolves_the_limits(monkeypatch: pytest.MonkeyPatch, other_model: Path) -> None:
    """`resolve_limits` (issue 54.1): the shipped defaults, the record of the task's model, the pool's
    explicit settings on top, whatever entry point asks (the plug-in, the pipeline judge, benches)."""
    from workloads.inference.judge.calibration import resolve_limits
    from workloads.inference.judge.thresholds import ValidationThresholds

    for name in ValidationThresholds.model_fields:
        monkeypatch.delenv(f"INTELLECT_VALIDATOR_{name.upper()}", raising=False)
    monkeypatch.chdir(other_model)  # no stray .env
    own = {"file_max_mant_mean": 0.9, "chunk_max_exp_mismatches": 16}
    record = CalibrationRecord(model_id=model_id(other_model) or "", name="other", made_by="a test",
                               thresholds=own)  # fmt: skip
    folder = other_model.parent / "records"
    folder.mkdir(exist_ok=True)
    (folder / "other.json").write_text(record.model_dump_json())
    monkeypatch.setenv(ENV, str(folder))
    limits = resolve_limits(other_model)
    assert limits.record == record and limits.overrides == {}
    assert (limits.thresholds.file_max_mant_mean, limits.thresholds.chunk_max_exp_mismatches) == (0.9, 16)
    assert limits.judged_by().model_dump() == {"source": "record", "record": "other", "backend": "torch",
                                               "device": "cpu", "model_id": record.model_id,
                                               "overrides": {}}  # fmt: skip
    monkeypatch.setenv("INTELLECT_VALIDATOR_CHUNK_MAX_EXP_MISMATCHES", "20")
    limits = resolve_limits(other_model)  # the pool's explicit setting wins over the record's
    assert limits.thresholds.chunk_max_exp_mismatches == 20 and limits.thresholds.file_max_mant_mean == 0.9
    assert limits.judged_by().overrides == {"chunk_max_exp_mismatches": 20}
    assert resolve_limits(other_model, {}).thresholds.chunk_max_exp_mismatches == 16  # a bench's own: none
    # the plug-in's judge (what `check` and `run` use) holds exactly these limits
    from intellect.workloads import NoCheckpoints, ValidatorEnv
    from workloads.inference.plugin import InferencePlugin

    judge = InferencePlugin().file_judge(task_for(other_model), ValidatorEnv(
        seen=MemorySeenStore(), data_dir=other_model.parent, checkpoints=NoCheckpoints()))  # fmt: skip
    assert isinstance(judge, InferenceJudge) and judge.thresholds == limits.thresholds
    monkeypatch.delenv(ENV)
    assert resolve_limits(other_model).judged_by().source == "uncalibrated"
    # a pipeline workload's record must name it: the group judge's replay limits are the tiny model's
    assert resolve_limits("tiny").calibrated("pipeline") and not limits.calibrated("pipeline")


def test_a_model_calibrated_but_not_for_the_tasks_backend_is_never_slashed_on_recomputation(
    tmp_path: Path, other_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 57: a record's top-level limits are the torch backend's; a task whose workers generate
    with vLLM is judged under the record's vLLM part. Without one, what the recomputation finds is not
    paid, never slashed, and the reason says which backend lacks a calibration; with one, its limits
    judge and a cheat is slashed again. (The file is the torch-made perturbed-model cheat: what the
    recomputation sees is the same whoever claims to have made it.)"""
    from workloads.inference.judge.calibration import BackendPart, resolve_limits

    path = made_by(other_model, tmp_path / "perturbed", "perturbed-model")
    folder = tmp_path / "records"
    folder.mkdir()
    record = CalibrationRecord(model_id=model_id(other_model) or "", name="other", made_by="this test")
    (folder / "other.json").write_text(record.model_dump_json())
    monkeypatch.setenv(ENV, str(folder))
    vllm_task = task_for(other_model).model_copy(update={"backend": "vllm"})
    limits = resolve_limits(other_model, {}, backend="vllm")
    assert limits.record == record and not limits.calibrated() and limits.judged_by().source == "uncalibrated"
    pipeline = InferenceJudge(vllm_task, MemorySeenStore(), ModelCheckpoints(str(other_model)))
    verdict = pipeline.judge(path, Submission(node=NODE))
    assert pipeline.calibration is None
    assert verdict.verdict == "soft_invalidate", verdict.reasons
    assert verdict.reasons and all("generated with backend 'vllm'" in r for r in verdict.reasons)
    assert verdict.judged_by is not None and verdict.judged_by.backend == "vllm"

    part = BackendPart(made_by="this test", thresholds={"chunk_max_exp_mismatches": 13})
    with_part = record.model_copy(update={"backends": {"vllm": part}})
    (folder / "other.json").write_text(with_part.model_dump_json())
    limits = resolve_limits(other_model, {}, backend="vllm")
    assert limits.calibrated() and limits.thresholds.chunk_max_exp_mismatches == 13
    assert resolve_limits(other_model, {}).thresholds.chunk_max_exp_mismatches != 13  # torch: top level
    pipeline = InferenceJudge(vllm_task, MemorySeenStore(), ModelCheckpoints(str(other_model)))
    verdict = pipeline.judge(path, Submission(node=NODE))
    assert verdict.verdict == "invalidate", verdict.reasons
    assert verdict.judged_by is not None and verdict.judged_by.label().endswith("vllm part")
