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
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field
from transformers import AutoModelForCausalLM

from workloads.inference.judge.calibration import CalibrationRecord, limits_of, model_id
from workloads.inference.judge.checks.model import recompute
from workloads.inference.judge.grades import Finding, grade
from workloads.inference.judge.limits import Sample, derive, failing_rules
from workloads.inference.judge.thresholds import ValidationThresholds
from workloads.inference.settings import InferenceSettings
from workloads.inference.workload import InferenceWorkload
from workloads.model.loading import load_model, load_tokenizer, load_weights, resolve
from workloads.rollouts import read_rollouts

MAX_FEED_BATCHES = 12  # files fed to one training step before the run is called untrainable
CHEATS = ("fp16 weights", "int8 weights", "noise 1e-2", "noise 1e-3", "another seed", "perturbed layer")


class CalibrationError(Exception):
    """The model cannot be calibrated; the message says what to fix."""


class Grid(BaseModel):
    """The honest settings measured, and how many cheating files."""

    generation_batches: list[int] = Field(default_factory=lambda: [1, 4, 16, 64])
    threads: list[int] = Field(default_factory=lambda: [1, 2])
    prefill_batches: list[int] = Field(default_factory=lambda: [1, 64])
    max_new_tokens: int = Field(32, ge=1)
    files_per_setting: int = Field(2, ge=1)
    one_token_files: int = Field(1, ge=0, description="files at max_new_tokens = 1 (rows without proofs)")
    train_steps: int = Field(0, ge=0, description="checkpoints of a short training run, each measured too")
    cheat_files: int = Field(2, ge=1)
    completions: int = Field(4, ge=1, description="completions per prompt (n)")

    @classmethod
    def quick(cls, max_new_tokens: int = 32) -> Grid:
        return cls(
            generation_batches=[1, 16], max_new_tokens=max_new_tokens, files_per_setting=1, cheat_files=1
        )


def _node(label: str) -> str:
    return "0x" + hashlib.sha256(label.encode()).hexdigest()[:40]


def _workload(model: str, out: Path, batch: int, grid: Grid, **extra: Any) -> InferenceWorkload:
    node = extra.pop("node_address", None) or _node(str(out))  # a folder's files: a node of their own
    return InferenceWorkload(InferenceSettings(
        model=model, node_address=node, output_dir=out, batch_size=batch, n=grid.completions,
        max_new_tokens=extra.pop("max_new_tokens", grid.max_new_tokens), device="cpu", **extra,
    ))  # fmt: skip


def _files(workload: InferenceWorkload, count: int) -> list[Path]:
    paths = []
    for _ in range(count):
        report = workload.run_batch()
        if report is None:
            raise CalibrationError("the inference workload wrote no file (no checkpoint for its step?)")
        paths.append(Path(report.path))
    return paths


def _noise(model: torch.nn.Module, sigma: float, only: str | None = None, seed: int = 7) -> None:
    """N(0, sigma) added to every matrix (or to the one named), in place."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and (only is None or name == only):
                p.add_((torch.randn(p.shape, generator=gen) * sigma).to(p.dtype))


def _quantize(model: torch.nn.Module, bits: int = 8) -> None:
    """Weight-only quantization, per output row, round to nearest (what a node saves memory with)."""
    levels = 2 ** (bits - 1) - 1
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                w = p.float()
                step = (w.abs().amax(dim=1, keepdim=True) / levels).clamp_min(1e-12)  # zero rows stay zero
                p.copy_((torch.round(w / step) * step).to(p.dtype))


def _reseed(model: torch.nn.Module, seed: int = 1) -> None:
    """The same config with another seed's random weights."""
    torch.manual_seed(seed)
    fresh = AutoModelForCausalLM.from_config(model.config)
    dtype = next(model.parameters()).dtype
    model.load_state_dict({k: v.to(dtype) for k, v in fresh.state_dict().items()})


def cheat_workload(model: str, kind: str, out: Path, batch: int, grid: Grid,
                   node_address: str | None = None) -> InferenceWorkload:  # fmt: skip
    """The inference workload producing one of `CHEATS` (planned for `node_address`, or for an address
    of the folder's own)."""
    if kind == "fp16 weights":
        return _workload(model, out, batch, grid, dtype="float16", node_address=node_address)
    workload = _workload(model, out, batch, grid, node_address=node_address)
    assert workload.model is not None
    if kind == "int8 weights":
        _quantize(workload.model, 8)
    elif kind == "noise 1e-2":
        _noise(workload.model, 1e-2)
    elif kind == "noise 1e-3":
        _noise(workload.model, 1e-3)
    elif kind == "another seed":
        _reseed(workload.model)
    elif kind == "perturbed layer":
        first = next(n for n, p in workload.model.named_parameters() if p.dim() >= 2 and "layers.0." in n)
        _noise(workload.model, 1e-2, only=first)
    else:
        raise ValueError(f"unknown cheat {kind!r}: one of {', '.join(CHEATS)}")
    return workload


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
) -> CalibrationRecord:
    """The whole measurement for `model` (a local folder with config.json and model.safetensors, or
    "tiny"): honest files, cheats, limits, false positives; the record it makes. `own`: checkpoints of
    the operator's training run of this model (step → safetensors file), measured like trained ones.
    `pipeline`: the pipeline replay's forward limits measured too (`pipeline_part`; `pipeline_quick`:
    4 batch shapes, one seed), and the record then calibrates that workload as well."""
    wanted = model_id(model)
    if wanted is None:
        raise CalibrationError(
            f"{model!r} has no local config.json and single model.safetensors: a record names its model by "
            "their content, so download or convert the model to one folder first"
        )
    started = time.time()
    threads_before = torch.get_num_threads()
    files: dict[str, list[Path]] = {}
    checkpoints: dict[str, Path] = {}
    lengths: dict[str, int] = {}
    try:
        for threads in grid.threads:
            torch.set_num_threads(threads)
            for batch in grid.generation_batches:
                setting = f"base b{batch} t{threads}"
                progress(f"honest files: {setting}")
                files[setting] = _files(_workload(model, work / setting.replace(" ", "-"), batch, grid),
                                        grid.files_per_setting)  # fmt: skip
                lengths[setting] = grid.max_new_tokens
        if grid.one_token_files:
            setting = "base b16 one token"
            progress(f"honest files: {setting}")
            files[setting] = _files(_workload(model, work / "one-token", 16, grid, max_new_tokens=1),
                                    grid.one_token_files)  # fmt: skip
            lengths[setting] = 1
        torch.set_num_threads(max(grid.threads))
        steps: list[tuple[int, Path]] = []
        if grid.train_steps:
            ckpt = train(model, work, grid.train_steps, grid, progress)
            steps += [(step, ckpt) for step in range(1, grid.train_steps + 1)]
        if own:
            ckpt = stage(own, work / "own-ckpt")
            steps += [(step, ckpt) for step in sorted(own)]
        for step, ckpt in steps:
            setting = f"step {step} b16" + (" (own)" if ckpt.name == "own-ckpt" else "")
            progress(f"honest files: {setting}")
            folder = work / f"{ckpt.name}-step-{step}"  # a trained and an own step 1 never share files
            workload = _workload(model, folder, 16, grid, step=step,
                                 checkpoint_source=str(ckpt / "step_{step}.safetensors"),
                                 checkpoint_cache=work / f"cache-{ckpt.name}")  # fmt: skip
            files[setting] = _files(workload, grid.files_per_setting)
            checkpoints[setting] = ckpt / f"step_{step}.safetensors"
            lengths[setting] = grid.max_new_tokens
        cheats: dict[str, list[Path]] = {}
        for kind in CHEATS:
            progress(f"cheating files: {kind}")
            cheats[kind] = _files(cheat_workload(model, kind, work / kind.replace(" ", "-"), 16, grid),
                                  grid.cheat_files)  # fmt: skip
            lengths[kind] = grid.max_new_tokens
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
    rules = failing_rules([findings for _, findings in honest_verdicts])
    grades = [(sample.setting, grade(findings, th)) for sample, findings in cheat_verdicts]
    caught = {kind: {g: grades.count((kind, g)) for g in ("strong", "marginal", "none")} for kind in CHEATS}
    config = json.loads((Path(resolve(model)) / "config.json").read_text())
    shape = {
        k: config.get(k) for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")
    }
    forward = pipeline_part(model, pipeline_quick, progress) if pipeline else {}
    return CalibrationRecord(
        model_id=wanted,
        name=name or Path(model).name,
        made_by=made_by,
        thresholds=derived.thresholds,
        workloads=["inference", "pipeline"] if pipeline else ["inference"],
        pipeline=forward,
        measured={
            "shape": shape,
            "grid": grid.model_dump(),
            "honest_files": sum(len(v) for v in files.values()),
            "honest_rows": sum(s.stats.rows for s in honest) // max(1, len(grid.prefill_batches)),
            "honest_recomputations": len(honest_verdicts),
            "false_positives": rules,
            "statistics": derived.table,
            "cheats_caught": caught,
            "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, torch {torch.__version__}",
            "seconds": round(time.time() - started, 1),
        },
    )


def pipeline_part(model: str, quick: bool, progress: Callable[[str], None]) -> dict[str, Any]:
    """The pipeline replay's forward limits for `model` (workloads/pipeline/tolerance_calibration.py:
    honest thread groups of 2 and 3 members, the compute-saving cheats graded). Imported here, lazily:
    the pipeline workload imports this package, so only this tool reaches back (pyproject's contracts)."""
    from workloads.pipeline.tolerance_calibration import measure_forward

    return measure_forward(model, load_model(model), load_tokenizer(model), quick=quick, progress=progress)
