"""The generating device as a matched dimension of the calibration (issue 57.3,
workloads/inference/judge/calibration.py): each rollout file states the device it was made on, its pay is
judged under the record's part for (the task's backend, that device), a slash rests only on evidence strong
under every part the record holds for the backend, and a device the record has no part for is never
slashed on the recomputation. The files are made with the torch backend on this CPU; the device a file
states is rewritten where a test needs another, as a dishonest node would."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from intellect.wire.verdicts import JudgedBy, Submission, Verdict
from intellect.workloads import MemoryNodeWindows, MemorySeenStore
from workloads.inference.judge.calibrate import CalibrationError, Grid, calibrate, made_on
from workloads.inference.judge.calibration import (
    ENV,
    SHIPPED,
    BackendPart,
    CalibrationRecord,
    find_calibration,
    limits_of,
    model_id,
    resolve_limits,
)
from workloads.inference.judge.file_judge import InferenceJudge
from workloads.inference.settings import InferenceSettings
from workloads.inference.task import TaskSettings
from workloads.inference.workload import InferenceWorkload
from workloads.model.loading import ModelCheckpoints, resolve
from workloads.rollouts import _META_BATCH, RolloutSchemaError, read_info, read_rollouts, to_table

NODE = "0x5aeda56215b167893e80b4fe645ba6d5bab767de"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny model no shipped record knows: each test writes the record it needs."""
    dst = tmp_path_factory.mktemp("models") / "devices"
    shutil.copytree(resolve("tiny"), dst)
    config = json.loads((dst / "config.json").read_text())
    config["intellect_note"] = "judged by device"
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def task_for(model: Path) -> TaskSettings:
    return TaskSettings(model=str(model), batch_size=4, n=4, max_new_tokens=16, target_lengths=[8, 12])


def made(model: Path, out: Path, cheat: str = "none", batches: int = 1) -> list[Path]:
    """Files from the inference workload on this CPU, the node's counters 1, 2, …"""
    task = task_for(model)
    workload = InferenceWorkload(InferenceSettings(
        node_address=NODE, output_dir=out, model=str(model), batch_size=task.batch_size, n=task.n,
        max_new_tokens=task.max_new_tokens, target_lengths=task.target_lengths, cheat=cheat, device="cpu",
    ))  # fmt: skip
    paths = []
    for _ in range(batches):
        report = workload.run_batch()
        assert report is not None
        paths.append(Path(report.path))
    return paths


def with_batch_json(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """`src` with its batch metadata (JSON) edited by `edit`: what a node writing its own files can do."""
    rows, info = read_rollouts(src)
    table = to_table(rows, info)
    meta = dict(table.schema.metadata)
    batch = json.loads(meta[_META_BATCH])
    edit(batch)
    meta[_META_BATCH] = json.dumps(batch).encode()
    pq.write_table(table.replace_schema_metadata(meta), dst)
    return dst


def claiming(src: Path, device: str) -> Path:
    dst = src.with_name(f"{src.stem}-{device}.parquet")
    return with_batch_json(src, dst, lambda b: b.update(device=device))


def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, record: CalibrationRecord) -> CalibrationRecord:
    folder = tmp_path / "records"
    folder.mkdir(exist_ok=True)
    (folder / "record.json").write_text(record.model_dump_json())
    monkeypatch.setenv(ENV, str(folder))
    return record


def record_of(model: Path, thresholds: dict[str, float | int] | None = None,
              **parts: BackendPart) -> CalibrationRecord:  # fmt: skip
    return CalibrationRecord(model_id=model_id(model) or "", name="devices", made_by="this test",
                             thresholds=thresholds or {}, backends=dict(parts))  # fmt: skip


def judged(model: Path, *paths: Path) -> tuple[InferenceJudge, list[Verdict]]:
    """A fresh validator judging `paths` in order (one node, its counters in order)."""
    pipeline = InferenceJudge(task_for(model), MemorySeenStore(), ModelCheckpoints(str(model)))
    return pipeline, [pipeline.judge(p, Submission(node=NODE)) for p in paths]


# ---- the file says where it was made ----------------------------------------------------------------


def test_a_file_states_its_device_and_an_old_file_reads_as_cpu(model: Path, tmp_path: Path) -> None:
    """The workload writes the torch device type it ran on; a file from before the field reads as "cpu"
    (every part such files were judged under was measured on the CPU) and is judged as before."""
    [path] = made(model, tmp_path / "new")
    assert read_info(path).device == "cpu"
    assert json.loads(pq.read_schema(path).metadata[_META_BATCH])["device"] == "cpu"
    old = with_batch_json(path, tmp_path / "old.parquet", lambda b: b.pop("device"))
    assert "device" not in json.loads(pq.read_schema(old).metadata[_META_BATCH])
    assert read_info(old).device == "cpu" and read_rollouts(old)[1].device == "cpu"
    _, [verdict] = judged(model, old)
    assert verdict.verdict == "accept", verdict.reasons
    assert verdict.judged_by is not None and verdict.judged_by.device == "cpu"


@pytest.mark.parametrize("hostile", ["CUDA", "cuda:1", "cuda\n", "", "x" * 17, "../cpu", "cu da", 5, None])
def test_a_device_that_is_not_a_short_lowercase_identifier_is_a_malformed_file(
    model: Path, tmp_path: Path, hostile: object
) -> None:
    [path] = made(model, tmp_path / "src")
    bad = with_batch_json(path, tmp_path / "bad.parquet", lambda b: b.update(device=hostile))
    with pytest.raises(RolloutSchemaError, match="batch metadata"):
        read_info(bad)
    _, [verdict] = judged(model, bad)
    assert verdict.verdict == "invalidate" and any("batch metadata" in r for r in verdict.reasons), verdict


def test_old_verdicts_parse_and_judged_by_names_the_part() -> None:
    old = JudgedBy.model_validate({"source": "record", "record": "tiny", "model_id": "ab" * 32,
                                   "backend": "vllm"})  # fmt: skip
    assert old.device == "cpu" and old.label().endswith("vllm part")
    on_cuda = JudgedBy(source="record", record="t", backend="vllm", device="cuda")
    assert on_cuda.label().endswith("vllm@cuda part")
    assert JudgedBy(source="record", record="t", device="cuda").label().endswith("torch@cuda part")
    assert JudgedBy(source="uncalibrated", device="cuda").label() == "uncalibrated for backend torch@cuda"


# ---- records keyed by backend and device ------------------------------------------------------------


def test_a_records_parts_are_keyed_by_backend_and_device(model: Path) -> None:
    """"vllm" is vLLM on the CPU (every shipped record's key, which loads as it did), "vllm@cuda" and
    "torch@cuda" other devices; the top level is torch on the CPU. Keys that would name one part twice,
    or a part measured elsewhere than its key says, make the file no record."""
    for path in sorted(SHIPPED.glob("*.json")):
        record = CalibrationRecord.model_validate_json(path.read_text())
        assert all(part.device == "cpu" for part in record.backends.values()), path
    tiny = find_calibration("tiny")
    assert tiny is not None and tiny.parts() == ["torch@cpu", "vllm@cpu"] and tiny.devices("vllm") == ["cpu"]
    cuda = BackendPart(made_by="t", device="cuda", thresholds={"file_max_mant_mean": 2.0})
    record = record_of(model, vllm=BackendPart(made_by="t"), **{"vllm@cuda": cuda, "torch@cuda": cuda})
    assert record.parts() == ["torch@cpu", "torch@cuda", "vllm@cpu", "vllm@cuda"]
    assert record.part("vllm", "cuda") == {"file_max_mant_mean": 2.0} and record.part("vllm", "mps") is None
    plain = BackendPart(made_by="t")
    refused = [("vllm@cpu", plain), ("torch", plain), ("torch@cpu", plain), ("vllm@cuda", plain),
               ("vllm", cuda), ("VLLM", plain), ("vllm\n", plain)]  # fmt: skip
    for key, part in refused:
        with pytest.raises(ValueError):
            CalibrationRecord.model_validate({**record_of(model).model_dump(),
                                              "backends": {key: part.model_dump()}})  # fmt: skip


def test_limits_are_chosen_per_device_and_a_slash_needs_every_part(model: Path) -> None:
    """Pay: the claimed device's part. Slash: `others` (every other part of the backend) must agree. A
    device without a part: the backend's CPU limits for pay, uncalibrated, the reason naming the device."""
    cuda = BackendPart(made_by="t", device="cuda", thresholds={"file_max_mant_mean": 2.0})
    record = record_of(model, {"file_max_mant_mean": 0.5}, **{"torch@cuda": cuda})
    cpu = limits_of(record, {})
    assert cpu.calibrated() and cpu.thresholds.file_max_mant_mean == 0.5 and cpu.part == "torch@cpu"
    assert [(n, o.file_max_mant_mean) for n, o in cpu.others] == [("torch@cuda", 2.0)]
    on_cuda = cpu.on("cuda")
    assert on_cuda.calibrated() and on_cuda.thresholds.file_max_mant_mean == 2.0
    assert [(n, o.file_max_mant_mean) for n, o in on_cuda.others] == [("torch@cpu", 0.5)]
    assert on_cuda.judged_by().device == "cuda" and on_cuda.judged_by().label().endswith("torch@cuda part")
    assert limits_of(record, {"file_max_mant_mean": 0.9}).others == ()  # the pool's own setting: one limit
    mps = cpu.on("mps")
    assert not mps.calibrated() and mps.others == () and mps.thresholds.file_max_mant_mean == 0.5
    assert mps.uncalibrated_reason("m") == ("no calibration for model 'm' generated with backend 'torch' on "
                                            "device 'mps' (the record calibrates torch@cpu, torch@cuda): not "
                                            "paid, not slashed")  # fmt: skip
    single = limits_of(find_calibration("tiny"), {}, backend="vllm")
    assert single.calibrated() and single.others == ()  # every shipped record: one device a backend


# ---- how a file is judged ---------------------------------------------------------------------------


def test_a_device_the_record_has_no_part_for_is_not_paid_never_slashed(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Perturbed weights are slashed claiming the CPU (the record's part); claiming a GPU the record
    holds no part for, the same strong findings are not paid, never slashed, the reason naming the
    device. Exact rules slash whatever the device."""
    records(tmp_path, monkeypatch, record_of(model, vllm=BackendPart(made_by="t")))
    [perturbed] = made(model, tmp_path / "perturbed", cheat="perturbed-model")
    _, [verdict] = judged(model, perturbed)
    assert verdict.verdict == "invalidate", verdict.reasons
    _, [verdict] = judged(model, claiming(perturbed, "cuda"))
    assert verdict.verdict == "soft_invalidate", verdict.reasons
    why = (f"no calibration for model {str(model)!r} generated with backend 'torch' on device 'cuda' (the "
           "record calibrates torch@cpu, vllm@cpu): not paid, not slashed")  # fmt: skip
    assert verdict.reasons and all(why in r for r in verdict.reasons), verdict.reasons
    assert verdict.judged_by is not None and verdict.judged_by.source == "uncalibrated"
    assert verdict.judged_by.device == "cuda"
    [forged] = made(model, tmp_path / "forged", cheat="forged-reward")
    _, [verdict] = judged(model, claiming(forged, "cuda"))
    assert verdict.verdict == "invalidate" and any("reward" in r for r in verdict.reasons), verdict.reasons


def test_failing_only_the_tighter_part_is_not_paid_and_never_slashed(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record with two parts for torch: on the CPU a file mantissa-mean limit at half what these honest
    files show (strong evidence under it: 2x and more), on CUDA the defaults. Claiming the CPU, they are
    not paid and never slashed, not even as the node's fourth such file (a mark in the window needs every
    part); claiming CUDA, they are paid, as an honest GPU node's would be. A perturbed model's file,
    strong under both parts, is slashed whatever it claims. (Some honest files of the tiny model are
    recomputed exactly, mantissa mean 0: they pass any limit.)"""
    honest = made(model, tmp_path / "honest", batches=8)
    loose = records(tmp_path, monkeypatch, record_of(model))
    means = []
    for path in honest:  # each file's own figure, judged alone
        one, _ = judged(model, path)
        assert one.last_stats is not None and one.last_stats.chunks >= one.thresholds.file_min_chunks
        means.append(one.last_stats.mant_mean)
    failing = [m > 0 for m in means]
    assert sum(failing) >= 4, means  # enough for the node's fourth marked file
    cuda = BackendPart(made_by="t", device="cuda")
    tight = {"file_max_mant_mean": min(m for m in means if m > 0) / 2}
    records(tmp_path, monkeypatch, loose.model_copy(update={"thresholds": tight,
                                                            "backends": {"torch@cuda": cuda}}))  # fmt: skip
    pipeline, verdicts = judged(model, *honest)
    assert pipeline.calibration is not None
    # the rest are paid, or not where the window pooled with them fails the CPU limit or a file not paid
    # before holds their counters (history.forfeit): never slashed
    own = [v.verdict for v, f in zip(verdicts, failing, strict=True) if f]
    assert own == ["soft_invalidate"] * sum(failing), [v.reasons for v in verdicts]
    assert all(v.verdict != "invalidate" for v in verdicts), [v.reasons for v in verdicts]
    for v in (v for v, f in zip(verdicts, failing, strict=True) if f):
        assert any("toploc: mean mantissa error" in r for r in v.reasons), v.reasons
        assert all("strong under the torch@cpu limits the file claims, none under torch@cuda's: not paid, "
                   "not slashed" in r for r in v.reasons), v.reasons  # fmt: skip
        assert v.judged_by is not None and (v.judged_by.source, v.judged_by.device) == ("record", "cpu")
    assert isinstance(pipeline.windows, MemoryNodeWindows)
    assert not any(e.get("marginal") for w in pipeline.windows.windows.values() for e in w)
    _, verdicts = judged(model, *[claiming(p, "cuda") for p in honest])
    assert [v.verdict for v in verdicts] == ["accept"] * len(honest), [v.reasons for v in verdicts]
    assert all(v.judged_by is not None and v.judged_by.label().endswith("torch@cuda part") for v in verdicts)
    [perturbed] = made(model, tmp_path / "perturbed", cheat="perturbed-model")
    for path in (perturbed, claiming(perturbed, "cuda")):
        _, [verdict] = judged(model, path)
        assert verdict.verdict == "invalidate", (path.name, verdict.reasons)


# ---- intellect-validator calibrate --device ---------------------------------------------------------


class Measured:
    """What `calibrate.measure` returns, as far as `calibrate` reads it (no files made)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.derived = type("Derived", (), {"thresholds": {"file_max_mant_mean": 1.5}})()

    def summary(self, *_: object) -> dict[str, Any]:
        return {"false_positives": {"failing": 0}}


def test_calibrate_stores_the_part_under_the_device_the_files_were_made_on(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--device`: the part goes under (backend, the device type the files state); torch on a GPU is a
    part too, the top level staying torch on the CPU; files that say another device than asked are
    refused. (The measurement itself is test_calibrate.py's: here it is replaced.)"""
    import workloads.inference.judge.calibrate as calibrate_module

    base = record_of(model, {"file_max_mant_mean": 0.8}, vllm=BackendPart(made_by="t"))
    monkeypatch.setattr(calibrate_module, "device_of", lambda grid: "cuda")
    monkeypatch.setattr(calibrate_module, "measure", lambda *a, **k: Measured("cuda"))
    grid = Grid.quick(8)
    for backend in ("torch", "vllm"):
        record = calibrate(str(model), tmp_path, grid, backend=backend, base=base, made_by="t")
        key = f"{backend}@cuda"
        assert set(record.backends) == {"vllm", key} and record.backends[key].device == "cuda"
        assert record.backends[key].thresholds == {"file_max_mant_mean": 1.5}
        assert record.thresholds == {"file_max_mant_mean": 0.8}
        assert record.backends["vllm"] == base.backends["vllm"]
        again = CalibrationRecord.model_validate_json(record.model_dump_json())
        assert again.part(backend, "cuda") is not None
    fresh = calibrate(str(model), tmp_path, grid, backend="torch", made_by="t")
    assert fresh.workloads == [] and fresh.parts() == ["torch@cuda"]
    with pytest.raises(CalibrationError, match="--device cpu"):
        calibrate(str(model), tmp_path, grid, pipeline=True, made_by="t")
    monkeypatch.setattr(calibrate_module, "measure", lambda *a, **k: Measured("cpu"))
    with pytest.raises(CalibrationError, match="made on 'cpu', not on 'cuda'"):
        calibrate(str(model), tmp_path, grid, made_by="t")


def test_calibrate_reads_the_device_from_the_files_and_refuses_a_device_it_cannot_use(
    model: Path, tmp_path: Path
) -> None:
    [path] = made(model, tmp_path / "files")
    assert made_on([path]) == "cpu"
    with pytest.raises(CalibrationError, match="one device"):
        made_on([path, claiming(path, "cuda")])
    from typer.testing import CliRunner

    from validator.cli import app

    result = CliRunner().invoke(app, ["calibrate", str(model), "--device", "tpu:0", "--out",
                                      str(tmp_path / "x.json")])  # fmt: skip
    assert result.exit_code == 2 and "is not one of auto, cpu, cuda or cuda:N" in result.output, result.output
    assert not (tmp_path / "x.json").exists()


def test_a_base_that_is_not_a_record_is_refused_by_name(tmp_path: Path) -> None:
    """`--base` naming a file that is not a record (a key the record format refuses: `vllm@cpu` is
    spelt `vllm`) exits 2 naming the file, before anything is measured."""
    from typer.testing import CliRunner

    from validator.cli import app

    record = json.loads((SHIPPED / "tiny.json").read_text())
    record["backends"] = {"vllm@cpu": record["backends"]["vllm"]}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(record))
    result = CliRunner().invoke(app, ["calibrate", "tiny", "--backend", "vllm", "--base", str(bad), "--out",
                                      str(tmp_path / "x.json")])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert f"--base {bad} is not a calibration record" in " ".join(result.output.split()), result.output
    assert not (tmp_path / "x.json").exists()


def test_limits_measured_recomputing_elsewhere_never_slash_on_the_recomputation(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record's limits hold where its files were recomputed (`recomputed_on`; calibrate recomputes on
    the CPU, and a record from before the field says cpu). A validator recomputing elsewhere (here: a
    record measured on a GPU, judged on this CPU) never slashes on them: perturbed weights are not paid,
    the reason naming both devices; exact rules still slash."""
    assert CalibrationRecord.model_validate_json((SHIPPED / "tiny.json").read_text()).recomputed_on == "cpu"
    assert resolve_limits("tiny", {}).calibrated()
    on_gpu = resolve_limits("tiny", {}, judge_device="cuda")
    assert not on_gpu.calibrated() and not on_gpu.on("cuda").calibrated()
    said = on_gpu.uncalibrated_reason("tiny")
    assert "measured recomputing on 'cpu'; this validator recomputes on 'cuda'" in said, said
    records(tmp_path, monkeypatch, record_of(model).model_copy(update={"recomputed_on": "cuda"}))
    [perturbed] = made(model, tmp_path / "perturbed", cheat="perturbed-model")
    _, [verdict] = judged(model, perturbed)
    assert verdict.verdict == "soft_invalidate", verdict.reasons
    why = (f"the calibration for model {str(model)!r} was measured recomputing on 'cuda'; this validator "
           "recomputes on 'cpu': not paid, not slashed")  # fmt: skip
    assert verdict.reasons and all(why in r for r in verdict.reasons), verdict.reasons
    [forged] = made(model, tmp_path / "forged", cheat="forged-reward")
    _, [verdict] = judged(model, forged)
    assert verdict.verdict == "invalidate" and any("reward" in r for r in verdict.reasons), verdict.reasons


def test_a_refused_record_for_the_tasks_model_is_said_and_other_files_are_not(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record the format refuses (here a part keyed `vllm@cpu`, which is spelt `vllm`) leaves its model
    uncalibrated, as before, but the lookup says so for the model it names; files that are not records,
    or records of other models, are ignored quietly."""
    import structlog

    record = json.loads(record_of(model, vllm=BackendPart(made_by="t")).model_dump_json())
    record["backends"] = {"vllm@cpu": record["backends"]["vllm"]}
    folder = tmp_path / "records"
    folder.mkdir()
    (folder / "bad.json").write_text(json.dumps(record))
    (folder / "notes.json").write_text('{"about": "not a record"}')
    (folder / "binary.json").write_bytes(b"\xff\xfe\x00")
    monkeypatch.setenv(ENV, str(folder))
    with structlog.testing.capture_logs() as logs:
        assert find_calibration(model) is None
        assert find_calibration("tiny") is not None  # the shipped record: nothing said about the others
    refused = [e for e in logs if e["log_level"] == "warning"]
    assert len(refused) == 1 and refused[0]["path"] == str(folder / "bad.json"), logs
    assert "judged uncalibrated" in refused[0]["event"]
