"""`intellect-validator calibrate`: measure a model's honest noise and its cheats, write its record.

The recomputation's limits depend on the model (issue 43): two bf16 computations of the same tokens
differ by rounding that compounds over depth and width, so the TOPLOC mantissa errors of an honest
file of a hidden-1024 model sit where the tiny model's fp16 cheat sat. This module makes the
calibration record (workloads/inference/judge/calibration.py) a validator needs before its recomputation
may slash:

1. **Honest files as workers make them**: the inference workload itself (its generation, sampling,
   proofs and file writer) at every generation batch and thread count of the grid, lengths from one
   token (a `max_new_tokens = 1` setting) to the task's maximum (EOS ends rows anywhere between), on
   the base weights and on the checkpoints of a short training run (`train_steps`).
2. **Recomputed as validators do**: every file at each prefill batch of the grid (1 and 64), with
   limits so loose that nothing fails, keeping each file's statistics (`FileStats`).
3. **The cheats**: files from the same workload with fp16 weights, int8 weights (per-row round to
   nearest: the memory a node would save), N(0, 1e-2) and N(0, 1e-3) noise on every matrix, another
   seed's weights, and one perturbed layer (N(0, 1e-2) on one attention matrix).
4. **Limits** (`derive`): each sits above the worst honest value with a stated margin, and, where a
   cheat sits far enough above, between the two (workloads/inference/judge/limits.py says how).
5. **The false positives measured**: every honest file judged again under the derived limits at
   every prefill batch (per rule: files failing, of how many), and each cheat's grade.

What the record cannot show is a tail rarer than its sample: a few dozen files bound a per-file
rate only to ~3/N (the rule of three), which is why a marginal failure is never slashed on its own
(workloads/inference/judge/grades.py) and why the shipped tiny record also rests on the soak
(bench/devnet_soak.py).
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from intellect.device import DeviceSettingError, resolve_device
from workloads.inference.judge.calibrate_files import (
    CHEATS,
    CalibrationError,
    Grid,
    Job,
    cheat_workload,
    made_on,
    make_files,
)
from workloads.inference.judge.calibrate_files import workload as _workload
from workloads.inference.judge.calibration import (
    CPU,
    TORCH,
    BackendPart,
    CalibrationRecord,
    limits_of,
    model_id,
    part_key,
)
from workloads.inference.judge.checks.model import recompute
from workloads.inference.judge.grades import Finding, Grade, grade
from workloads.inference.judge.limits import Derived, Sample, derive, failing_rules
from workloads.inference.judge.thresholds import ValidationThresholds
from workloads.model.loading import load_model, load_tokenizer, load_weights, resolve
from workloads.rollouts import read_rollouts

MAX_FEED_BATCHES = 12  # files fed to one training step before the run is called untrainable
__all__ = ["CHEATS", "CalibrationError", "Grid", "calibrate", "cheat_workload"]  # cheat_workload: the tests'


def train(model: str, work: Path, steps: int, grid: Grid, progress: Callable[[str], None]) -> Path:
    """`steps` GRPO steps on string reversal (the demo's trainer settings) from `model`; every
    checkpoint kept. Returns the folder of `step_<n>.safetensors`."""
    from workloads.trainer.loop import Trainer
    from workloads.trainer.settings import TrainerSettings
    from workloads.trainer.sources import LocalDirSource

    ckpt, feed = work / "ckpt", work / "train-rollouts"
    trainer = Trainer(
        TrainerSettings.for_cpu_demo(model=model, output_dir=ckpt, rollouts=str(feed), max_steps=steps,
                                     keep=steps + 1, device="cpu"),
        LocalDirSource(feed),
    )  # fmt: skip
    source = str(ckpt / "step_{step}.safetensors")
    feeder = _workload(model, feed, 16, grid, dataset="reverse", max_new_tokens=16, step=0,
                       checkpoint_source=source, checkpoint_cache=work / "cache-t")  # fmt: skip
    batches = 0
    while trainer.step < steps:
        feeder.s.step = trainer.step
        feeder.run_batch()
        batches += 1
        trainer.collect()
        if trainer.ready():
            trainer.train_step()
            batches = 0
            progress(f"trained step {trainer.step} of {steps}")
        elif batches >= MAX_FEED_BATCHES:
            raise CalibrationError(
                f"the model does not train on string reversal: {batches} files gave step {trainer.step + 1} "
                "too few rows with a reward that differs within their group (random weights?); calibrate "
                "with --train-steps 0, and add checkpoints of your own run with --checkpoint STEP=PATH"
            )
    return ckpt


def stage(own: dict[int, Path], folder: Path) -> Path:
    """The operator's checkpoints as the workload fetches them: `step_<n>.safetensors` + sha256 sidecar."""
    folder.mkdir(parents=True, exist_ok=True)
    for step, path in own.items():
        if not Path(path).is_file():
            raise CalibrationError(f"checkpoint of step {step}: {path} is not a file")
        target = folder / f"step_{step}.safetensors"
        shutil.copyfile(path, target)
        digest = hashlib.sha256(target.read_bytes()).hexdigest()
        (folder / f"step_{step}.safetensors.sha256").write_text(digest + "\n")
    return folder


Recomputed = tuple[Sample, list[Finding]]


def recompute_all(
    model_path: str,
    files: dict[str, list[Path]],
    checkpoints: dict[str, Path],
    prefills: list[int],
    lengths: dict[str, int],
    th: ValidationThresholds,
) -> list[Recomputed]:
    """Every file recomputed under `th` at every prefill batch, as a validator does: its statistics
    and findings (the row-mean share is in units of `th`'s row limit)."""
    tok = load_tokenizer(model_path)
    base = load_model(model_path)
    out = []
    for setting, paths in files.items():
        checkpoint = checkpoints.get(setting)
        model = load_weights(load_model(model_path), checkpoint) if checkpoint is not None else base
        for path in paths:
            rows, _ = read_rollouts(path)
            for prefill in prefills:
                findings, stats = recompute(
                    model, rows, eos_token_id=int(tok.eos_token_id), pad_token_id=int(tok.pad_token_id),
                    max_new_tokens=lengths[setting], th=th.model_copy(update={"prefill_batch_size": prefill}),
                )  # fmt: skip
                out.append((Sample(setting=setting, prefill=prefill, stats=stats), findings))
    return out


def _jobs(model: str, work: Path, grid: Grid, backend: str, progress: Callable[[str], None],
          own: dict[int, Path] | None) -> tuple[list[Job], dict[str, Path]]:  # fmt: skip
    """What to make: honest settings (generation batch x threads, one-token rows, checkpoints of a
    short training run and the operator's own), then the cheats; and each setting's checkpoint."""
    jobs: list[Job] = []
    checkpoints: dict[str, Path] = {}
    threads: list[int | None] = list(grid.threads) if backend == "torch" else [None]  # vLLM binds its own
    for count in threads:
        for batch in grid.generation_batches:
            setting = f"base b{batch} " + (f"t{count}" if count is not None else backend)
            jobs.append(Job(setting=setting, folder=work / setting.replace(" ", "-"), batch=batch,
                            files=grid.files_per_setting, max_new_tokens=grid.max_new_tokens, threads=count))
    if grid.one_token_files:
        jobs.append(Job(setting="base b16 one token", folder=work / "one-token", batch=16,
                        files=grid.one_token_files, max_new_tokens=1))  # fmt: skip
    steps: list[tuple[int, Path]] = []
    if grid.train_steps:  # trained with the torch backend here: the trainer's checkpoints, whoever generates
        torch.set_num_threads(max(grid.threads))
        ckpt = train(model, work, grid.train_steps, grid, progress)
        steps += [(step, ckpt) for step in range(1, grid.train_steps + 1)]
    if own:
        ckpt = stage(own, work / "own-ckpt")
        steps += [(step, ckpt) for step in sorted(own)]
    for step, ckpt in steps:
        setting = f"step {step} b16" + (" (own)" if ckpt.name == "own-ckpt" else "")
        jobs.append(Job(  # a trained and an own step 1 never share files
            setting=setting, folder=work / f"{ckpt.name}-step-{step}", batch=16,
            files=grid.files_per_setting, max_new_tokens=grid.max_new_tokens, step=step,
            checkpoint_source=str(ckpt / "step_{step}.safetensors"),
            checkpoint_cache=work / f"cache-{ckpt.name}",
        ))  # fmt: skip
        checkpoints[setting] = ckpt / f"step_{step}.safetensors"
    for kind in CHEATS:
        jobs.append(Job(setting=kind, folder=work / kind.replace(" ", "-"), batch=16, files=grid.cheat_files,
                        max_new_tokens=grid.max_new_tokens, cheat=kind))  # fmt: skip
    return jobs, checkpoints


def calibrate(
    model: str,
    work: Path,
    grid: Grid,
    *,
    name: str | None = None,
    made_by: str = "intellect-validator calibrate",
    own: dict[int, Path] | None = None,
    progress: Callable[[str], None] = lambda _m: None,
    pipeline: bool = False,
    pipeline_quick: bool = False,
    backend: str = TORCH,
    base: CalibrationRecord | None = None,
) -> CalibrationRecord:
    """The whole measurement for `model` (a local folder with config.json and model.safetensors, or
    "tiny"): honest files, cheats, limits, false positives; the record it makes. `own`: checkpoints of
    the operator's training run of this model (step → safetensors file), measured like trained ones.
    `pipeline`: the pipeline replay's forward limits measured too (`pipeline_part`; `pipeline_quick`:
    4 batch shapes, one seed), and the record then calibrates that workload as well.

    `backend`: the generating backend the files are made with (workloads/inference/judge/calibrate_files.py),
    on `grid.device`. Not torch on the CPU: the measurement is that backend's part for the device type the
    files say they were made on (`part_key`: "vllm", "vllm@cuda", "torch@cuda") in the model's record
    (`base`, else a record that calibrates nothing else), every other part of `base` kept."""
    wanted = model_id(model)
    if wanted is None:
        raise CalibrationError(
            f"{model!r} has no local config.json and single model.safetensors: a record names its model by "
            "their content, so download or convert the model to one folder first"
        )
    device = device_of(grid)
    if (backend, device) != (TORCH, CPU) and pipeline:
        raise CalibrationError("--pipeline measures the pipeline workload, which generates with torch on the "
                               "CPU here: calibrate it with --backend torch --device cpu")  # fmt: skip
    if base is not None and base.recomputed_on != CPU:  # every part of a record holds for one judge device
        raise CalibrationError(f"the base record's files were recomputed on {base.recomputed_on!r}; this "
                               "measurement recomputes on the CPU: start a record of its own")  # fmt: skip
    started = time.time()
    run = measure(model, work, grid, backend, progress, own)
    if run.device != device:
        raise CalibrationError(f"the files say they were made on {run.device!r}, not on {device!r} as asked")
    measured = run.summary(model, grid, started)
    if (backend, device) != (TORCH, CPU):
        thresholds = run.derived.thresholds
        part = BackendPart(made_by=made_by, device=device, thresholds=thresholds, measured=measured)
        record = base or CalibrationRecord(model_id=wanted, name=name or Path(model).name, made_by=made_by,
                                           workloads=[])  # fmt: skip
        return record.model_copy(update={"backends": {**record.backends, part_key(backend, device): part}})
    forward = pipeline_part(model, pipeline_quick, progress) if pipeline else {}
    return CalibrationRecord(
        model_id=wanted,
        name=name or Path(model).name,
        made_by=made_by,
        thresholds=run.derived.thresholds,
        workloads=["inference", "pipeline"] if pipeline else ["inference"],
        pipeline=forward,
        measured=measured,
        backends=base.backends if base is not None else {},
    )


def device_of(grid: Grid) -> str:
    """The device type the grid's files are generated on here (`grid.device` resolved on this host, as
    the workload resolves it: "cuda", never "cuda:1")."""
    try:
        return resolve_device(grid.device).type
    except DeviceSettingError as exc:
        raise CalibrationError(str(exc)) from None


@dataclass
class Measurement:
    """Steps 1-5 of the module's docstring for one model: the files made, the limits derived from
    their statistics, and every file judged again under those limits."""

    files: dict[str, list[Path]]  # honest files by setting
    honest: list[Sample]  # under the shipped defaults, loose enough that every statistic is kept
    derived: Derived
    th: ValidationThresholds  # the record's limits, as judges get them
    honest_verdicts: list[Recomputed]
    cheat_verdicts: list[Recomputed]
    device: str = CPU  # where the files say they were made (`BatchInfo.device`)

    def summary(self, model: str, grid: Grid, started: float) -> dict[str, Any]:
        """The record's `measured`: the model's shape, the grid, the false positives per rule, the
        statistics table and each cheat's grades."""
        rules = failing_rules([findings for _, findings in self.honest_verdicts])
        grades = [(sample.setting, grade(findings, self.th)) for sample, findings in self.cheat_verdicts]
        levels: tuple[Grade, ...] = ("strong", "marginal", "none")
        caught = {kind: {g: grades.count((kind, g)) for g in levels} for kind in CHEATS}
        config = json.loads((Path(resolve(model)) / "config.json").read_text())
        shape = {
            k: config.get(k) for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")
        }
        return {
            "shape": shape,
            "grid": grid.model_dump(),
            "honest_files": sum(len(v) for v in self.files.values()),
            "honest_rows": sum(s.stats.rows for s in self.honest) // max(1, len(grid.prefill_batches)),
            "honest_recomputations": len(self.honest_verdicts),
            "false_positives": rules,
            "statistics": self.derived.table,
            "cheats_caught": caught,
            "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, torch {torch.__version__}",
            "seconds": round(time.time() - started, 1),
        }


def measure(model: str, work: Path, grid: Grid, backend: str, progress: Callable[[str], None],
            own: dict[int, Path] | None) -> Measurement:  # fmt: skip
    """Make the files, recompute them, derive the limits and judge every file again under them, with
    the grid's torch threads (the caller's count restored after)."""
    threads_before = torch.get_num_threads()
    try:
        jobs, checkpoints = _jobs(model, work, grid, backend, progress, own)
        progress(f"making {sum(j.files for j in jobs)} files with the {backend} backend "
                 f"({len([j for j in jobs if j.cheat is None])} honest settings, {len(CHEATS)} cheats)")
        made = make_files(model, grid, jobs, backend, work)
        torch.set_num_threads(max(grid.threads))
        lengths = {j.setting: j.max_new_tokens for j in jobs}
        files = {j.setting: made[j.setting] for j in jobs if j.cheat is None}
        cheats = {j.setting: made[j.setting] for j in jobs if j.cheat is not None}
        progress("recomputing every file at prefill batches " + ", ".join(map(str, grid.prefill_batches)))
        # The pool's own INTELLECT_VALIDATOR_* settings play no part in a measurement: the shipped
        # defaults, loose enough here that every file's statistics are kept.
        prefills, default = grid.prefill_batches, ValidationThresholds.defaults()
        honest = [s for s, _ in recompute_all(model, files, checkpoints, prefills, lengths, default)]
        cheating = [s for s, _ in recompute_all(model, cheats, {}, [max(prefills)], lengths, default)]
        derived = derive(honest, cheating)
        th = limits_of(None, derived.thresholds).thresholds  # the record's limits, as judges get them
        progress("judging every file again under the derived limits")
        honest_verdicts = recompute_all(model, files, checkpoints, prefills, lengths, th)
        cheat_verdicts = recompute_all(model, cheats, {}, [max(prefills)], lengths, th)
    finally:
        torch.set_num_threads(threads_before)
    device = made_on([p for paths in made.values() for p in paths])
    return Measurement(files, honest, derived, th, honest_verdicts, cheat_verdicts, device)


def pipeline_part(model: str, quick: bool, progress: Callable[[str], None]) -> dict[str, Any]:
    """The pipeline replay's forward limits for `model` (workloads/pipeline/tolerance_calibration.py:
    honest thread groups of 2 and 3 members, the compute-saving cheats graded). Imported here, lazily:
    the pipeline workload imports this package, so only this tool reaches back (pyproject's contracts)."""
    from workloads.pipeline.tolerance_calibration import measure_forward

    return measure_forward(model, load_model(model), load_tokenizer(model), quick=quick, progress=progress)
