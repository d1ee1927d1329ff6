"""Which models this validator may slash on: calibration records, addressed by the model's content.

The recomputation's limits (workloads/inference/judge/thresholds.py) were measured on one model: what an
honest
file of another model looks like is not known until it is measured (a Qwen2-shaped model of hidden
1024 has 73 % of its honest chunks past the tiny model's share limit, issue 43). So a recomputation
failure slashes only on a model a record exists for; on any other model the validator still judges,
but what check 8 finds is at most "not paid", and it says so (log, the verdict's reason, the
dashboard, which shows reasons). Exact rules (schema, plan, rewards, tokens after EOS, …) slash on
any model: they do not depend on it.

A record names its model by content: `model_id` = sha256 over the model's config (canonical JSON,
without the writer's `transformers_version`) and the sha256 of its weights file, so a copy of the
tiny model anywhere is calibrated and a model whose weights or shape differ by anything is not.
Trained checkpoints of a calibrated base model are judged under the base model's record (the task
names the base model); `intellect-validator calibrate` (workloads/inference/judge/calibrate.py) measures
checkpoints
of a short training run, or the operator's own, when it makes a record.

Records are JSON files: the shipped ones in `workloads/inference/judge/calibrations/`, and the operator's
in the folders of `INTELLECT_VALIDATOR_CALIBRATIONS` (os.pathsep-separated).

**One place resolves a verdict's limits**: `resolve_limits`. Every judge that recomputes (the inference
judge behind `intellect-validator check` and `run`, the pipeline workload's judge, the calibrate
command's own re-judging, the benches, the tests) gets its limits there: the shipped defaults, then the
record's, then the pool's explicit settings (`INTELLECT_VALIDATOR_*` env vars, or a bench's own); and
whether its measured rules may slash at all (only under a record made on the task's model, and for
inference files under the record's part for the task's generating backend: the top-level limits are
the torch backend's, `backends` holds the others', issue 57). Issue 54:
the plug-in once handed the judge the tiny model's limits whatever the record said, and honest files of
every wider model were slashed; a judge now has no way to get limits but this one.

**A part is a backend on one device** (issue 57.3): GPU kernels round differently from CPU ones, so a
part measured on files made on the CPU says nothing of a GPU's honest noise. Each rollout file states
the device it was made on (`BatchInfo.device`, "cpu" for files older than the field), and a file is
judged under the part for (the task's backend, the file's device): `Limits.on(device)`. Keys of
`backends`: the backend's name for its CPU part ("vllm": what every record held before devices were
matched, so the shipped records mean what they meant), `backend@device` for others ("vllm@cuda",
"torch@cuda"); the top-level limits are torch on the CPU. The device is the node's claim, so it decides
PAY only: a slash must rest on evidence strong under every part the record holds for the backend
(`Limits.others`), so that claiming a tighter device never costs an honest node its stake and claiming
a looser one gets a cheat what an honest node of that device gets. A device the record has no part for
is judged like a backend with none: recomputation failures are not paid, never slashed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel, Field, model_validator

from intellect.wire.verdicts import JudgedBy
from workloads.inference.judge.thresholds import ValidationThresholds
from workloads.model.loading import base_checkpoint_sha256, resolve
from workloads.rollouts import DEVICE_PATTERN

log = structlog.get_logger(__name__)

SHIPPED = Path(__file__).resolve().parent / "calibrations"
ENV = "INTELLECT_VALIDATOR_CALIBRATIONS"
# config keys that say which library wrote the file, not what the model is
VOLATILE = frozenset({"transformers_version", "_name_or_path"})


TORCH = "torch"  # the backend a record's top-level limits were measured with
CPU = "cpu"  # the device they were measured on (and what a file without a device says)
_KEY = re.compile(r"[a-z][a-z0-9_]{0,31}(@[a-z][a-z0-9_]{0,15})?")  # fullmatch: no trailing newline


def part_key(backend: str, device: str) -> str:
    """The `backends` key of the part measured on files `backend` made on `device`: the backend's name
    on the CPU ("vllm"), `backend@device` elsewhere ("vllm@cuda", "torch@cuda")."""
    return backend if device == CPU else f"{backend}@{device}"


def part_name(backend: str, device: str) -> str:
    """How reasons and verdicts name a part: always `backend@device` ("torch@cpu": the top level)."""
    return f"{backend}@{device}"


def split_key(key: str) -> tuple[str, str]:
    backend, _, device = key.partition("@")
    return backend, device or CPU


class BackendPart(BaseModel):
    """The limits of files a generating backend made on one device (`CalibrationRecord.backends`):
    the same model recomputed by the same torch prefill, but vLLM's kernels round differently from the
    torch decoder's, and a GPU's from a CPU's, so its honest noise is its own (issue 57: 12 of 16 honest
    vLLM rows failed the torch limits)."""

    made_by: str = Field(description="the command that measured it")
    device: str = Field(
        CPU, pattern=DEVICE_PATTERN, description="the device type the measured files were generated on "
        "(matched: the part judges files that state it; its key in `backends` names it too)",
    )
    thresholds: dict[str, float | int] = Field(
        default_factory=dict, description="ValidationThresholds fields that differ from the defaults"
    )
    measured: dict[str, Any] = Field(default_factory=dict, description="honest and cheating figures, margins")


class CalibrationRecord(BaseModel):
    model_id: str = Field(description="sha256 of the model's canonical config JSON and its weights' sha256")
    name: str = Field(description="the model it was made on, as the task names it")
    made_by: str = Field(description="the command that measured it")
    thresholds: dict[str, float | int] = Field(
        default_factory=dict, description="ValidationThresholds fields that differ from the defaults"
    )
    measured: dict[str, Any] = Field(default_factory=dict, description="honest and cheating figures, margins")
    recomputed_on: str = Field(
        CPU, pattern=DEVICE_PATTERN,
        description="the device type every part's files were recomputed on, as a validator's check 8 does "
        "(`intellect-validator calibrate` recomputes on the CPU): the limits hold for validators judging "
        "there; one judging elsewhere never slashes on them",
    )
    workloads: list[str] = Field(
        default_factory=lambda: ["inference"],
        description="the judges whose measured rules this record calibrates (\"pipeline\" only where the "
        "pipeline replay's limits were measured on the model: `intellect-validator calibrate --pipeline`)",
    )
    backends: dict[str, BackendPart] = Field(
        default_factory=dict,
        description="limits measured on files other generating backends or devices made, by `part_key`: "
        "\"vllm\" (on the CPU), \"vllm@cuda\", \"torch@cuda\"; the top-level thresholds are the torch "
        "backend's on the CPU (`intellect-validator calibrate --backend --device`)",
    )
    pipeline: dict[str, Any] = Field(
        default_factory=dict,
        description="the pipeline replay's forward limits (`limits`: workloads/pipeline/tolerance.py's "
        "ForwardLimits fields) and the honest and cheating figures they rest on (`measured`)",
    )

    @model_validator(mode="after")
    def _keys_name_their_parts(self) -> CalibrationRecord:
        """Each key is `part_key` of its part's backend and device: one spelling per part ("vllm", never
        "vllm@cpu"), torch on the CPU only at the top level. Anything else is not a record."""
        for key, part in self.backends.items():
            backend, device = split_key(key)
            spelled = _KEY.fullmatch(key) is not None and key == part_key(backend, device)
            if not spelled or (backend, device) == (TORCH, CPU):
                raise ValueError(f"backends key {key!r} is not BACKEND or BACKEND@DEVICE (torch on cpu is "
                                 "the record's top level)")  # fmt: skip
            if part.device != device:
                raise ValueError(f"backends[{key!r}] was measured on {part.device!r}; its key: {device!r}")
        return self

    def part(self, backend: str, device: str) -> dict[str, float | int] | None:
        """The limits measured on files `backend` made on `device` (fields that differ from the defaults),
        or None where the record calibrates no such part."""
        if (backend, device) == (TORCH, CPU):
            return self.thresholds if "inference" in self.workloads else None
        found = self.backends.get(part_key(backend, device))
        return found.thresholds if found is not None else None

    def devices(self, backend: str) -> list[str]:
        """The devices this record calibrates `backend` on, the CPU first."""
        keyed = sorted(d for b, d in map(split_key, self.backends) if b == backend and d != CPU)
        return [d for d in [CPU, *keyed] if self.part(backend, d) is not None]

    def parts(self) -> list[str]:
        """Every part the record calibrates, named `backend@device` ("torch@cpu, vllm@cpu")."""
        backends = [TORCH, *sorted({split_key(k)[0] for k in self.backends} - {TORCH})]
        return [part_name(b, d) for b in backends for d in self.devices(b)]


def model_id(name_or_path: str | Path | None) -> str | None:
    """The content address of a local model (config + weights), or None where it has no single local
    weights file (a hub name, a sharded model): such a model cannot be matched to a record."""
    weights = base_checkpoint_sha256(name_or_path)
    config = Path(resolve(name_or_path)) / "config.json"
    if weights is None or not config.is_file():
        return None
    fields = {k: v for k, v in json.loads(config.read_text()).items() if k not in VOLATILE}
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{canonical}\n{weights}".encode()).hexdigest()


def record_folders() -> list[Path]:
    extra = [Path(p) for p in os.environ.get(ENV, "").split(os.pathsep) if p]
    return [SHIPPED, *extra]


def find_calibration(name_or_path: str | Path | None) -> CalibrationRecord | None:
    """The record made on this model's content, or None (then recomputation failures never slash)."""
    return _record_for(model_id(name_or_path))


def _record_for(wanted: str | None) -> CalibrationRecord | None:
    if wanted is None:
        return None
    for folder in record_folders():
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            text = ""
            try:
                text = path.read_text()  # a file of other bytes: a UnicodeDecodeError, a ValueError too
                record = CalibrationRecord.model_validate_json(text)
            except ValueError as exc:  # not a record: ignored, as any other file in the folder, but one
                if _names_model(text, wanted):  # made for this model is the operator's to fix: said
                    log.warning("a calibration record for the task's model is refused: the model is judged "
                                "uncalibrated (never slashed on recomputation)", path=str(path),
                                error=str(exc)[:400])  # fmt: skip
                continue
            if record.model_id == wanted:
                return record
    return None


def _names_model(text: str, wanted: str) -> bool:
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("model_id") == wanted


@dataclass(frozen=True)
class Limits:
    """What judges one task's files made on one device: the thresholds (they decide pay), the record
    they rest on (None: uncalibrated, so a measured rule's failure is at most "not paid"), what the pool
    set explicitly, and the limits of the backend's other calibrated devices (`others`: a slash must be
    strong under each of them too)."""

    thresholds: ValidationThresholds
    record: CalibrationRecord | None
    overrides: dict[str, float | int]
    model_id: str | None = None
    backend: str = TORCH
    device: str = CPU
    others: tuple[tuple[str, ValidationThresholds], ...] = ()
    judge_device: str = CPU  # where this validator recomputes (check 8's prefill)

    def calibrated(self, workload: str = "inference") -> bool:
        """Whether this workload's measured rules may slash: a record made on the task's model that
        calibrates the workload, and for inference files the task's generating backend on the file's
        device, recomputed where this validator recomputes."""
        if self.record is None:
            return False
        if workload == "inference":
            return (self.record.part(self.backend, self.device) is not None
                    and self.judge_device == self.record.recomputed_on)  # fmt: skip
        return workload in self.record.workloads

    @property
    def part(self) -> str:
        """The part that judges: `backend@device`."""
        return part_name(self.backend, self.device)

    def on(self, device: str) -> Limits:
        """The same task's limits for a file made on `device` (the file's own word: it decides pay)."""
        if device == self.device:
            return self
        return limits_of(self.record, self.overrides, self.model_id, self.backend, device, self.judge_device)

    def uncalibrated_reason(self, model: str) -> str:
        """What a recomputation failure's reason says when it cannot slash (not paid, and why)."""
        parts = ", ".join(self.record.parts()) if self.record is not None else ""
        if self.record is not None and self.judge_device != self.record.recomputed_on:
            return (f"the calibration for model {model!r} was measured recomputing on "
                    f"{self.record.recomputed_on!r}; this validator recomputes on {self.judge_device!r}: "
                    "not paid, not slashed")  # fmt: skip
        if parts and not self.calibrated():  # a record for the model, with no part for this backend here
            return (f"no calibration for model {model!r} generated with backend {self.backend!r} on device "
                    f"{self.device!r} (the record calibrates {parts}): not paid, not slashed")  # fmt: skip
        return f"no calibration for model {model!r}: not paid, not slashed"

    @property
    def forward(self) -> dict[str, float] | None:
        """The pipeline replay's forward limits the record states for its model (`ForwardLimits` fields;
        `ForwardLimits.from_record` reads them), or None: a record that does not calibrate the pipeline
        workload, or states none, leaves the tiny model's (never slashed on another model)."""
        if self.record is None or not self.calibrated("pipeline"):
            return None
        return dict(self.record.pipeline.get("limits") or {}) or None

    def judged_by(self, workload: str = "inference") -> JudgedBy:
        backend, device = (self.backend, self.device) if workload == "inference" else (TORCH, CPU)
        if self.record is None or not self.calibrated(workload):
            return JudgedBy(source="uncalibrated", model_id=self.model_id or "", overrides=self.overrides,
                            backend=backend, device=device)  # fmt: skip
        return JudgedBy(source="record", record=self.record.name, model_id=self.record.model_id,
                        overrides=self.overrides, backend=backend, device=device)  # fmt: skip


def pool_overrides() -> dict[str, float | int]:
    """The thresholds this validator's operator set explicitly (`INTELLECT_VALIDATOR_*`, .env)."""
    env = ValidationThresholds()
    return {name: getattr(env, name) for name in sorted(env.model_fields_set)}


def limits_of(
    record: CalibrationRecord | None, overrides: Mapping[str, float | int] | None = None,
    model_id: str | None = None, backend: str = TORCH, device: str = CPU, judge_device: str = CPU,
) -> Limits:
    """Defaults ← the record's limits for `backend` on `device` ← the overrides (a record being made: its
    own derived limits). A part the record lacks gets the backend's CPU part, else the torch limits, and
    is never slashed on. `others`: the limits of every other device the record calibrates the backend on
    (each with the same overrides), those that differ from the part's."""
    given = dict(overrides or {})

    def full(measured: Mapping[str, float | int]) -> ValidationThresholds:
        return ValidationThresholds.defaults().model_copy(update={**measured, **given})

    own = record.part(backend, device) if record is not None else None
    measured: Mapping[str, float | int] = {}
    if record is not None:
        measured = next(p for p in (own, record.part(backend, CPU), record.thresholds) if p is not None)
    thresholds = full(measured)
    others: list[tuple[str, ValidationThresholds]] = []
    if record is not None and own is not None:
        for other in record.devices(backend):
            limits = full(record.part(backend, other) or {})
            if other != device and limits != thresholds:
                others.append((part_name(backend, other), limits))
    return Limits(thresholds, record, given, model_id or (record.model_id if record else None), backend,
                  device, tuple(others), judge_device)  # fmt: skip


def resolve_limits(
    model: str | Path | None, overrides: Mapping[str, float | int] | None = None, *, backend: str = TORCH,
    device: str = CPU, judge_device: str = CPU,
) -> Limits:
    """THE way a judge gets its limits for a task's `model` and generating `backend`, for files made on
    `device` (the module's docstring; a judge moves to a file's own device with `Limits.on`), recomputed
    on `judge_device` (the validator's own). `overrides` None: the pool's explicit settings from the
    environment; a mapping: exactly those (a bench, a test)."""
    wanted = model_id(model)
    return limits_of(_record_for(wanted), pool_overrides() if overrides is None else overrides, wanted,
                     backend, device, judge_device)  # fmt: skip
