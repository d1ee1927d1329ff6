"""The single-node inference workload as a plug-in of the workload seam (`intellect.workloads`).

Settings: every field of `InferenceSettings` may be given in `workload.settings` or as its
`INTELLECT_INFER_<NAME>` env var (the form tasks used before the seam). Both are checked when the task
is POSTed: an unknown name, a bad value, the two places disagreeing, or more new tokens than the
model has positions is a 422 naming the setting. The rendered task passes every setting as its env
var, so the program (`python -m workloads.inference`) and the validators read the same values.

Validation: the checks pipeline of `workloads/inference/judge/file_judge.py` with the task's judged settings
(`TaskSettings`), the trainer's checkpoints (the validator's step URL, else the task's) and the
validator's memory of judged files. (The checks still live in `workloads/inference/judge/checks/`; they
are this
plug-in's, and no other workload's.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from intellect.wire.tasks import TaskSpec
from intellect.workloads import FileJudge, ValidatorEnv, WorkloadSettingsError, runs_module, with_program
from workloads.inference.settings import InferenceSettings
from workloads.inference.task import ENV_PREFIX, TaskSettings, parse_env_value

IMAGE = "intellect-workload:latest"
VLLM_IMAGE = "intellect-workload-vllm:latest"  # backend: vllm (`make images-vllm`)
ENTRYPOINT = ["python3", "-m", "workloads.inference"]
# Set by the worker or the runtime, never by the task: a task setting them would be refused later.
RUNTIME_OWNED = {"node_address", "output_dir", "checkpoint_cache"}
# Every node plans its batches for its own address (the validators check it): never one for all.
NODE_ADDRESS_ENV = ENV_PREFIX + "NODE_ADDRESS"
OWN_ADDRESS = "${NODE_ADDRESS}"
SHIPPED_MODELS = {"", "tiny"}


def _shipped_model_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "model" / "tiny"


def _shipped_datasets_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "datasets"


def max_positions(model: str) -> int | None:
    """The positions a local model has (its config.json), None where that cannot be known offline."""
    folder = _shipped_model_dir() if model in SHIPPED_MODELS else Path(model)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def _env_text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, list | dict | bool) else str(value)


class InferencePlugin:
    """`workload: {"type": "inference", "settings": {...}}`."""

    name: ClassVar[str] = "inference"

    def _collect(self, spec: TaskSpec) -> dict[str, Any]:
        fields = InferenceSettings.model_fields
        given = dict(spec.workload.settings) if spec.workload else {}
        for key in given:
            if key not in fields:
                raise WorkloadSettingsError(f"workload.settings.{key}", "not an inference workload setting")
        values: dict[str, Any] = {}
        for env_key, raw in spec.env_vars.items():
            if not env_key.startswith(ENV_PREFIX):
                continue
            name = env_key.removeprefix(ENV_PREFIX).lower()
            if name not in fields:
                raise WorkloadSettingsError(f"env_vars.{env_key}", "not an inference workload setting")
            if env_key == NODE_ADDRESS_ENV and raw != OWN_ADDRESS:
                raise WorkloadSettingsError(
                    f"env_vars.{env_key}",
                    f"must be {OWN_ADDRESS} (or left out): a node whose files are planned for another "
                    "address is invalidated",
                )
            if "${" in raw:  # templated per node (e.g. ${NODE_ADDRESS}): known only on the worker
                continue
            try:
                values[name] = parse_env_value(name, raw)
            except ValueError as exc:
                raise WorkloadSettingsError(f"env_vars.{env_key}", str(exc)) from None
        for name, value in given.items():
            if name in values and _env_text(values[name]) != _env_text(value):
                raise WorkloadSettingsError(
                    f"workload.settings.{name}",
                    f"{value!r} disagrees with env_vars.{ENV_PREFIX}{name.upper()}={values[name]!r}; "
                    "set it in one place",
                )
            values[name] = value
        for name in RUNTIME_OWNED & set(given):
            raise WorkloadSettingsError(f"workload.settings.{name}", "is set by the worker, not by the task")
        return values

    def task_settings(self, spec: TaskSpec) -> TaskSettings:
        values = self._collect(spec)
        fields = InferenceSettings.model_fields
        for name, value in values.items():
            if name in TaskSettings.model_fields:
                continue
            try:  # settings only the program reads: their type is checked here, their use there
                TypeAdapter(fields[name].annotation or Any).validate_python(value)
            except ValidationError as exc:
                raise WorkloadSettingsError(f"workload.settings.{name}", _first_error(exc)) from None
        judged = TaskSettings.defaults().model_dump() | {
            k: v for k, v in values.items() if k in TaskSettings.model_fields
        }
        try:
            settings = TaskSettings.model_validate(judged)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "settings"
            raise WorkloadSettingsError(f"workload.settings.{where}", err["msg"]) from None
        positions = max_positions(settings.model)
        if positions is not None and settings.max_new_tokens >= positions:
            raise WorkloadSettingsError(
                "workload.settings.max_new_tokens",
                f"{settings.max_new_tokens} new tokens do not fit model {settings.model!r}, which has "
                f"{positions} positions (prompt included)",
            )
        shipped = sorted(p.stem for p in _shipped_datasets_dir().glob("*.jsonl"))
        if "/" not in settings.dataset and "." not in settings.dataset and settings.dataset not in shipped:
            raise WorkloadSettingsError(
                "workload.settings.dataset",
                f"{settings.dataset!r} is neither a shipped set ({', '.join(shipped)}) nor a .jsonl or "
                ".parquet path",
            )
        if max(settings.target_lengths) > settings.max_new_tokens:
            raise WorkloadSettingsError(
                "workload.settings.target_lengths",
                f"a target length above max_new_tokens ({settings.max_new_tokens}) can never be met",
            )
        return settings

    def claims(self, spec: TaskSpec) -> bool:
        """A task naming no workload that runs `python3 -m workloads.inference` (settings as env vars, the
        form before the seam) is this plug-in's: judged as it always was."""
        return runs_module(spec, "workloads.inference")

    def render(self, spec: TaskSpec, settings: BaseModel) -> TaskSpec:
        given = spec.workload.settings if spec.workload else {}
        env = dict(spec.env_vars)
        env[NODE_ADDRESS_ENV] = OWN_ADDRESS
        for name, value in given.items():
            env[ENV_PREFIX + name.upper()] = _env_text(value)
        # A task that names no image gets the workload's; for the vLLM backend the one with vLLM in it.
        image = VLLM_IMAGE if env.get(ENV_PREFIX + "BACKEND") == "vllm" else IMAGE
        return with_program(spec, env, image, ENTRYPOINT)

    def work_units(self, path: Path) -> int:
        from workloads.rollouts import read_rollouts

        rows, _ = read_rollouts(path)
        return sum(len(r.output_tokens) for r in rows)

    def file_judge(self, settings: BaseModel, env: ValidatorEnv) -> FileJudge:
        from workloads.inference.judge.file_judge import InferenceJudge
        from workloads.model.loading import ModelCheckpoints

        task = settings if isinstance(settings, TaskSettings) else TaskSettings.model_validate(settings)
        # limits: the record of the task's model and the pool's explicit settings (resolve_limits)
        return InferenceJudge(task, env.seen, ModelCheckpoints(task.model, env.checkpoints),
                              max_bytes=env.max_file_bytes, windows=env.windows, task_id=env.task_id,
                              device=env.device)  # fmt: skip

    def validator_commands(self) -> dict[str, Callable[..., None]]:
        """`intellect-validator calibrate`: measures a model's honest noise and cheats for this judge."""
        from workloads.inference.judge.calibrate_cli import calibrate_command

        return {"calibrate": calibrate_command}


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return str(err["msg"])
