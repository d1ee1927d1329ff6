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
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from intellect.wire.verdicts import JudgedBy
from workloads.inference.judge.thresholds import ValidationThresholds
from workloads.model.loading import base_checkpoint_sha256, resolve

SHIPPED = Path(__file__).resolve().parent / "calibrations"
ENV = "INTELLECT_VALIDATOR_CALIBRATIONS"
# config keys that say which library wrote the file, not what the model is
VOLATILE = frozenset({"transformers_version", "_name_or_path"})


TORCH = "torch"  # the backend a record's top-level limits were measured with


class BackendPart(BaseModel):
    """The limits of files another generating backend made (`CalibrationRecord.backends`): the same
    model recomputed by the same torch prefill, but vLLM's kernels round differently from the torch
    decoder's, so its honest noise is its own (issue 57: 12 of 16 honest vLLM rows failed the torch
    limits)."""

    made_by: str = Field(description="the command that measured it")
    device: str = Field("cpu", description="where the measured files were generated (recorded, not matched)")
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
    workloads: list[str] = Field(
        default_factory=lambda: ["inference"],
        description="the judges whose measured rules this record calibrates (\"pipeline\" only where the "
        "pipeline replay's limits were measured on the model: `intellect-validator calibrate --pipeline`)",
    )
    backends: dict[str, BackendPart] = Field(
        default_factory=dict,
        description="limits measured on files other generating backends made, by backend (\"vllm\"); the "
        "top-level thresholds are the torch backend's (`intellect-validator calibrate --backend`)",
    )
    pipeline: dict[str, Any] = Field(
        default_factory=dict,
        description="the pipeline replay's forward limits (`limits`: workloads/pipeline/tolerance.py's "
        "ForwardLimits fields) and the honest and cheating figures they rest on (`measured`)",
    )


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
            try:
                record = CalibrationRecord.model_validate_json(path.read_text())
            except ValueError:
                continue  # not a record: ignored, as any other file in the folder
            if record.model_id == wanted:
                return record
    return None


@dataclass(frozen=True)
class Limits:
    """What judges one task's files: the thresholds, the record they rest on (None: uncalibrated, so a
    measured rule's failure is at most "not paid"), and what the pool set explicitly."""

    thresholds: ValidationThresholds
    record: CalibrationRecord | None
    overrides: dict[str, float | int]
    model_id: str | None = None
    backend: str = TORCH

    def calibrated(self, workload: str = "inference") -> bool:
        """Whether this workload's measured rules may slash: a record made on the task's model that
        calibrates the workload, and for inference files the task's generating backend."""
        if self.record is None:
            return False
        if workload == "inference" and self.backend != TORCH:
            return self.backend in self.record.backends
        return workload in self.record.workloads

    def uncalibrated_reason(self, model: str) -> str:
        """What a recomputation failure's reason says when it cannot slash (not paid, and why)."""
        if self.record is not None and self.backend != TORCH and self.backend not in self.record.backends:
            parts = ", ".join([TORCH, *self.record.backends])
            return (f"no calibration for model {model!r} generated with backend {self.backend!r} (the record "
                    f"calibrates {parts}): not paid, not slashed")  # fmt: skip
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
        backend = self.backend if workload == "inference" else TORCH
        if self.record is None or not self.calibrated(workload):
            return JudgedBy(source="uncalibrated", model_id=self.model_id or "", overrides=self.overrides,
                            backend=backend)  # fmt: skip
        return JudgedBy(source="record", record=self.record.name, model_id=self.record.model_id,
                        overrides=self.overrides, backend=backend)  # fmt: skip


def pool_overrides() -> dict[str, float | int]:
    """The thresholds this validator's operator set explicitly (`INTELLECT_VALIDATOR_*`, .env)."""
    env = ValidationThresholds()
    return {name: getattr(env, name) for name in sorted(env.model_fields_set)}


def limits_of(
    record: CalibrationRecord | None, overrides: Mapping[str, float | int] | None = None,
    model_id: str | None = None, backend: str = TORCH,
) -> Limits:
    """Defaults ← the record's limits for `backend` ← the overrides (a record being made: its own
    derived limits). A backend the record has no part for gets the torch limits, never slashed on."""
    given = dict(overrides or {})
    measured = record.thresholds if record else {}
    if record is not None and backend != TORCH and backend in record.backends:
        measured = record.backends[backend].thresholds
    thresholds = ValidationThresholds.defaults().model_copy(update={**measured, **given})
    return Limits(thresholds, record, given, model_id or (record.model_id if record else None), backend)


def resolve_limits(
    model: str | Path | None, overrides: Mapping[str, float | int] | None = None, *, backend: str = TORCH
) -> Limits:
    """THE way a judge gets its limits for a task's `model` and generating `backend` (the module's
    docstring). `overrides` None: the pool's explicit settings from the environment; a mapping: exactly
    those (a bench, a test)."""
    wanted = model_id(model)
    return limits_of(_record_for(wanted), pool_overrides() if overrides is None else overrides, wanted,
                     backend)  # fmt: skip
