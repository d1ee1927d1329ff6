"""The files a calibration measures, made by the inference workload with the generating backend.

`intellect-validator calibrate --backend B` measures what honest files of backend B look like to the
validator's torch prefill, and how B's cheats look. The files must come from B as workers run it;
the recomputation must be the validator's own (its process, its pinned packages). So the making is
a list of `Job`s: run here for the torch backend, and for vLLM in the vLLM environment
(`make vllm`: .venv-vllm, whose transformers differs from the validator's) as one child process,
`python -m workloads.inference.judge.calibrate_files JOBS.json`, which starts one engine for all
of them (cheats with other weights load them into it; fp16 restarts it in fp16 at the end).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field
from transformers import AutoModelForCausalLM

from workloads.inference.settings import InferenceSettings
from workloads.inference.workload import InferenceWorkload
from workloads.model import vllm_backend
from workloads.model.loading import load_model
from workloads.rollouts import read_info

CHEATS = ("fp16 weights", "int8 weights", "noise 1e-2", "noise 1e-3", "another seed", "perturbed layer")
BACKENDS = ("torch", "vllm")
ROOT = Path(__file__).resolve().parents[3]


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
    device: str = Field(
        "cpu", description="where the files are generated (the workload's device setting: auto, cpu, cuda or "
        "cuda:N); the part is stored under the device type the files then say they were made on",
    )

    @classmethod
    def quick(cls, max_new_tokens: int = 32) -> Grid:
        return cls(
            generation_batches=[1, 16], max_new_tokens=max_new_tokens, files_per_setting=1, cheat_files=1
        )


class Job(BaseModel):
    """`files` files of one setting: honest (cheat None) or one of `CHEATS`."""

    setting: str
    folder: Path
    batch: int
    files: int
    max_new_tokens: int
    threads: int | None = Field(None, description="torch threads (torch backend only; vLLM binds its own)")
    cheat: str | None = None
    step: int = 0
    checkpoint_source: str | None = None
    checkpoint_cache: Path | None = None


def node_for(label: str) -> str:
    return "0x" + hashlib.sha256(label.encode()).hexdigest()[:40]


def workload(model: str, out: Path, batch: int, grid: Grid, backend: str = "torch",
             **extra: Any) -> InferenceWorkload:  # fmt: skip
    node = extra.pop("node_address", None) or node_for(str(out))  # a folder's files: a node of their own
    return InferenceWorkload(InferenceSettings(
        model=model, node_address=node, output_dir=out, batch_size=batch, n=grid.completions,
        max_new_tokens=extra.pop("max_new_tokens", grid.max_new_tokens), device=grid.device, backend=backend,
        **extra,
    ))  # fmt: skip


def made_on(paths: list[Path]) -> str:
    """The device type the files say they were made on (`BatchInfo.device`): one for all of them, or the
    measurement is refused (a part is one device's)."""
    devices = {read_info(p).device for p in paths}
    if len(devices) != 1:
        raise CalibrationError(f"the measured files were made on {sorted(devices)}: a part is one device's")
    return devices.pop()


def files_of(made: InferenceWorkload, count: int) -> list[Path]:
    paths = []
    for _ in range(count):
        report = made.run_batch()
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


def cheat_weights(model: torch.nn.Module, kind: str) -> None:
    """One of `CHEATS` (all but fp16, which is a dtype) applied to a torch model's weights in place."""
    if kind == "int8 weights":
        _quantize(model, 8)
    elif kind == "noise 1e-2":
        _noise(model, 1e-2)
    elif kind == "noise 1e-3":
        _noise(model, 1e-3)
    elif kind == "another seed":
        _reseed(model)
    elif kind == "perturbed layer":
        first = next(n for n, p in model.named_parameters() if p.dim() >= 2 and "layers.0." in n)
        _noise(model, 1e-2, only=first)
    else:
        raise ValueError(f"unknown cheat {kind!r}: one of {', '.join(CHEATS)}")


def cheat_workload(model: str, kind: str, out: Path, batch: int, grid: Grid,
                   node_address: str | None = None, backend: str = "torch") -> InferenceWorkload:  # fmt: skip
    """The inference workload producing one of `CHEATS` (planned for `node_address`, or for an address
    of the folder's own), with the torch backend or vLLM (the cheat's weights loaded into its engine)."""
    if kind == "fp16 weights":
        return workload(model, out, batch, grid, backend, dtype="float16", node_address=node_address)
    if kind not in CHEATS:
        raise ValueError(f"unknown cheat {kind!r}: one of {', '.join(CHEATS)}")
    made = workload(model, out, batch, grid, backend, node_address=node_address)
    if made.vllm is not None:
        weights = load_model(model)
        cheat_weights(weights, kind)
        made.vllm.load_state(dict(weights.state_dict()), serving=f"cheat {kind}")
    else:
        assert made.model is not None
        cheat_weights(made.model, kind)
    return made


def run_jobs(model: str, grid: Grid, jobs: list[Job], backend: str) -> dict[str, list[Path]]:
    """Every job's files, made in this process. fp16 jobs last: on vLLM they restart the engine."""
    threads_before = torch.get_num_threads()
    made: dict[str, list[Path]] = {}
    try:
        for job in sorted(jobs, key=lambda j: j.cheat == "fp16 weights"):
            if job.threads is not None and backend == "torch":
                torch.set_num_threads(job.threads)
            if job.cheat is not None:
                maker = cheat_workload(model, job.cheat, job.folder, job.batch, grid, backend=backend)
            else:
                extra: dict[str, Any] = {"max_new_tokens": job.max_new_tokens}
                if job.checkpoint_source is not None:
                    extra |= {"step": job.step, "checkpoint_source": job.checkpoint_source,
                              "checkpoint_cache": job.checkpoint_cache}  # fmt: skip
                maker = workload(model, job.folder, job.batch, grid, backend, **extra)
            made[job.setting] = files_of(maker, job.files)
    finally:
        torch.set_num_threads(threads_before)
    return made


def vllm_python() -> str:
    try:
        return vllm_backend.vllm_python()
    except vllm_backend.VLLMMissing as exc:
        raise CalibrationError(str(exc)) from None


def make_files(model: str, grid: Grid, jobs: list[Job], backend: str, work: Path) -> dict[str, list[Path]]:
    """Every job's files, made with `backend`: here for torch, in the vLLM environment for vllm."""
    if backend not in BACKENDS:
        raise CalibrationError(f"unknown backend {backend!r}: one of {', '.join(BACKENDS)}")
    if backend == "torch":
        return run_jobs(model, grid, jobs, backend)
    spec = work / "vllm-jobs.json"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(json.dumps({"model": model, "grid": grid.model_dump(),
                                "jobs": [j.model_dump(mode="json") for j in jobs]}))  # fmt: skip
    result = work / "vllm-files.json"
    done = subprocess.run([vllm_python(), "-m", "workloads.inference.judge.calibrate_files", str(spec),
                           str(result)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise CalibrationError(f"vLLM's file maker failed (exit {done.returncode}): {done.stdout[-3000:]}")
    return {k: [Path(p) for p in v] for k, v in json.loads(result.read_text()).items()}


def main(argv: list[str]) -> int:
    """`python -m workloads.inference.judge.calibrate_files JOBS.json OUT.json` (vLLM's environment)."""
    spec = json.loads(Path(argv[0]).read_text())
    jobs = [Job.model_validate(j) for j in spec["jobs"]]
    made = run_jobs(spec["model"], Grid.model_validate(spec["grid"]), jobs, "vllm")
    Path(argv[1]).write_text(json.dumps({k: [str(p) for p in v] for k, v in made.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
