"""The pipeline-group workload as a plug-in of the workload seam (`intellect.workloads`, name `pipeline`).

A task `{"workload": {"type": "pipeline", "settings": {...}}, "allowed_topologies": ["2x0GB"]}` runs
one stage per member of a node group (`python -m workloads.pipeline task`, `workload.py`). Settings
(`settings.PipelineSettings`) are checked when the task is POSTed (422 naming the setting): their types
and ranges, a group topology present, every topology's member count at most the model's layers.

Crediting rule: each member submits its own copy of the batch's file, naming its stage, for its share
of the work: the batch's output tokens × its layers / the model's layers, rounded up (`GroupFile.
work_units`), stated with every other member's in the file's receipt (`files.group_receipt`), which
the judge holds to the file and `intellect-pool audit --group` reads. Judging: `judge/` (the plug-in's
`file_judge` is `judge.file_judge.PipelineJudge`, imported only when a validator builds one, so the
orchestrator's check of a POSTed task loads no model code).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ValidationError

from intellect.wire.tasks import TaskSpec
from intellect.workloads import FileJudge, ValidatorEnv, WorkloadSettingsError, with_program
from workloads.pipeline.options import CHEATS, ENV_PREFIX, WORKLOAD
from workloads.pipeline.settings import PipelineSettings

IMAGE = "intellect-workload:latest"
ENTRYPOINT = ["python3", "-m", "workloads.pipeline", "task"]  # __main__.py: one member as its task
TOPOLOGIES = "scheduling_config.plugins.node_groups.allowed_topologies"
# What each member learns from its worker: the group's place, its own transport secret and every
# member's public key (not the group-wide `${GROUP_SECRET}`: it names the group, not a member, so links
# keyed by it would let a member speak as another), its inbox, its identity.
RUNTIME_ENV = {
    "GROUP_ID": "${GROUP_ID}", "GROUP_INDEX": "${GROUP_INDEX}", "GROUP_SIZE": "${GROUP_SIZE}",
    "MEMBER_SECRET": "${MEMBER_SECRET}", "GROUP_KEYS": "${GROUP_KEYS}", "GROUP_MEMBERS": "${GROUP_MEMBERS}",
    "NEXT_ADDRESS": "${NEXT_P2P_ADDRESS}",
    "INBOX": "${P2P_INBOX}", "OUTBOX": "${P2P_OUTBOX}",
    "P2P_PORT": "${WORKER_P2P_PORT}", "NODE_ADDRESS": "${NODE_ADDRESS}", "TASK_ID": "${TASK_ID}",
}  # fmt: skip


_SHIPPED_MODEL = Path(__file__).resolve().parents[1] / "model" / "tiny"  # workloads.model.loading's "tiny"


def model_layers(model: str) -> int:
    """The model's layer count. A local model (the shipped one, or a folder) is read from its
    config.json: the orchestrator asks this when a task is POSTed, and going through transformers
    imported torch on that path (seconds; on a busy machine past a client's 10 s: seen in CI). A hub
    name goes through transformers' AutoConfig, as the members load it."""
    folder = _SHIPPED_MODEL if model in (None, "", "tiny") else Path(model)
    config = folder / "config.json"
    if config.is_file():
        return int(json.loads(config.read_text())["num_hidden_layers"])
    from workloads.pipeline.stages import plan_stages

    return plan_stages(model, 1)[0].layers.stop


def topology_members(name: str) -> int | None:
    """`2x0GB` → 2 (the member count a topology name starts with), None when it names none."""
    head = name.split("x", 1)[0]
    return int(head) if head.isdigit() and "x" in name else None


def _member_env(settings: BaseModel) -> dict[str, str]:
    """The member program's environment: the task's settings and the group's templates."""
    env = {}
    for name, value in settings.model_dump().items():
        if value is None:
            continue  # unset: the member's own default (None), not the string "None"
        env[ENV_PREFIX + name.upper()] = json.dumps(value) if isinstance(value, list) else str(value)
    return env | {ENV_PREFIX + name: value for name, value in RUNTIME_ENV.items()}


class PipelinePlugin:
    """`workload: {"type": "pipeline", "settings": {...}}` with a group topology."""

    name: ClassVar[str] = WORKLOAD

    def task_settings(self, spec: TaskSpec) -> PipelineSettings:
        given = dict(spec.workload.settings) if spec.workload else {}
        try:
            settings = PipelineSettings.model_validate(given)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(["workload.settings", *(str(p) for p in err["loc"])])
            raise WorkloadSettingsError(where, err["msg"]) from None
        if settings.cheat not in CHEATS:
            raise WorkloadSettingsError("workload.settings.cheat", f"one of {', '.join(CHEATS)}")
        # A spec as the orchestrator stores it is rendered (validators read it back and check it again):
        # its INTELLECT_PIPELINE_* variables are then exactly what rendering writes. Any other is refused.
        rendered = _member_env(settings)
        for key, value in spec.env_vars.items():
            if key.startswith(ENV_PREFIX) and rendered.get(key) != value:
                raise WorkloadSettingsError(f"env_vars.{key}", "pipeline settings go in workload.settings")
        if not spec.allowed_topologies:
            raise WorkloadSettingsError(TOPOLOGIES, "a pipeline task runs on node groups: name at least one "
                                        "group topology (e.g. ['2x0GB'])")  # fmt: skip
        try:
            layers = model_layers(settings.model)
        except (OSError, ValueError) as exc:
            raise WorkloadSettingsError("workload.settings.model", f"cannot read its config: {exc}") from None
        for name in spec.allowed_topologies:
            members = topology_members(name)
            if members is not None and members > layers:
                raise WorkloadSettingsError(TOPOLOGIES, f"{name}: {members} members for a model of "
                                            f"{layers} layers (one layer at least per member)")  # fmt: skip
        return settings

    def claims(self, spec: TaskSpec) -> bool:
        """A task naming no workload that runs the member program as a task (`ENTRYPOINT`'s
        `-m workloads.pipeline task`) is a pipeline task; the program run by flags is no task's."""
        argv, program = [*(spec.entrypoint or []), *spec.cmd], ENTRYPOINT[1:]
        return any(argv[i : i + len(program)] == program for i in range(len(argv)))

    def render(self, spec: TaskSpec, settings: BaseModel) -> TaskSpec:
        return with_program(spec, dict(spec.env_vars) | _member_env(settings), IMAGE, ENTRYPOINT)

    def work_units(self, path: Path) -> int:
        from workloads.pipeline.files import read_group_file

        data = read_group_file(path)
        return data.work_units(model_layers(data.model))

    def file_judge(self, settings: BaseModel, env: ValidatorEnv) -> FileJudge:
        from workloads.pipeline.judge.file_judge import PipelineJudge

        if isinstance(settings, PipelineSettings):
            return PipelineJudge(settings, env)
        return PipelineJudge(PipelineSettings.model_validate(settings.model_dump()), env)
