"""The pipeline-group workload as a plug-in of the workload seam (`intellect.workloads`, name `pipeline`).

A task `{"workload": {"type": "pipeline", "settings": {...}}, "allowed_topologies": ["2x0GB"]}` runs
one stage per member of a node group (`task.py`). Settings are checked when the task is POSTed (422
naming the setting): their types and ranges, a group topology present, every topology's member count
at most the model's layers.

Crediting rule: each member submits its own copy of the batch's file, naming its stage, for its share
of the work: the batch's output tokens × its layers / the model's layers, rounded up (`GroupFile.
work_units`). Judging (`PipelineJudge`): the batch is judged once (one prefill, `verify.judge_group`),
then each member's file gets its verdict: the whole batch accepted → every member paid; a member
blamed → its file `invalidate` (slashed by the quorum), every other member's `soft_invalidate` (not
paid, the batch was bad; never slashed); nobody blamed → everyone's `soft_invalidate`.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from intellect.wire.tasks import TaskSpec
from intellect.wire.verdicts import Submission, Verdict, VerdictKind
from intellect.workloads import FileJudge, ValidatorEnv, WorkloadSettingsError, with_program
from workloads.pipeline.member import CHEATS
from workloads.pipeline.task import ENV_PREFIX

IMAGE = "intellect-workload:latest"
ENTRYPOINT = ["python3", "-m", "workloads.pipeline.task"]
TOPOLOGIES = "scheduling_config.plugins.node_groups.allowed_topologies"
# What each member learns from its worker: the group's place and secret, its inbox, its identity.
RUNTIME_ENV = {
    "GROUP_ID": "${GROUP_ID}", "GROUP_INDEX": "${GROUP_INDEX}", "GROUP_SIZE": "${GROUP_SIZE}",
    "GROUP_SECRET": "${GROUP_SECRET}", "NEXT_ADDRESS": "${NEXT_P2P_ADDRESS}",
    "INBOX": "${P2P_INBOX}", "OUTBOX": "${P2P_OUTBOX}",
    "P2P_PORT": "${WORKER_P2P_PORT}", "NODE_ADDRESS": "${NODE_ADDRESS}", "TASK_ID": "${TASK_ID}",
}  # fmt: skip


class PipelineSettings(BaseModel):
    """`workload.settings` of a pipeline task (the trainer's part; the group's comes from the worker)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("tiny", max_length=500)
    dataset: str = Field("reverse", max_length=500)
    batch_size: int = Field(8, ge=1, le=256)
    batches: int = Field(4, ge=1, le=100_000)
    max_new_tokens: int = Field(32, ge=1, le=4096)
    temperature: float = Field(1.0, gt=0, le=10)
    timeout_seconds: float = Field(60.0, gt=0, le=3600)
    cheat: str = Field("none", description="demos and tests only")
    cheat_stage: int = Field(-1, ge=-1, le=63)


def model_layers(model: str) -> int:
    from workloads.pipeline.stages import plan_stages

    return plan_stages(model, 1)[0].layers.stop


def topology_members(name: str) -> int | None:
    """`2x0GB` → 2 (the member count a topology name starts with), None when it names none."""
    head = name.split("x", 1)[0]
    return int(head) if head.isdigit() and "x" in name else None


class PipelinePlugin:
    """`workload: {"type": "pipeline", "settings": {...}}` with a group topology."""

    name: ClassVar[str] = "pipeline"

    def task_settings(self, spec: TaskSpec) -> PipelineSettings:
        given = dict(spec.workload.settings) if spec.workload else {}
        try:
            settings = PipelineSettings.model_validate(given)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "settings"
            raise WorkloadSettingsError(f"workload.settings.{where}", err["msg"]) from None
        if settings.cheat not in CHEATS:
            raise WorkloadSettingsError("workload.settings.cheat", f"one of {', '.join(CHEATS)}")
        for key in spec.env_vars:
            if key.startswith(ENV_PREFIX):
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

    def render(self, spec: TaskSpec, settings: BaseModel) -> TaskSpec:
        env = dict(spec.env_vars)
        for name, value in settings.model_dump().items():
            env[ENV_PREFIX + name.upper()] = str(value)
        for name, value in RUNTIME_ENV.items():
            env[ENV_PREFIX + name] = value
        return with_program(spec, env, IMAGE, ENTRYPOINT)

    def work_units(self, path: Path) -> int:
        from workloads.pipeline.files import read_group_file

        data = read_group_file(path)
        return data.work_units(model_layers(data.model))

    def file_judge(self, settings: BaseModel, env: ValidatorEnv) -> FileJudge:
        if isinstance(settings, PipelineSettings):
            return PipelineJudge(settings, env)
        return PipelineJudge(PipelineSettings.model_validate(settings.model_dump()), env)


class PipelineJudge:
    """Judges each member's file of a pipeline task. The batch's group verdict is computed once and
    kept (by the batch's content) for the other members' files."""

    def __init__(self, task: PipelineSettings, env: ValidatorEnv, keep: int = 256) -> None:
        import torch

        from workloads.datasets import load_dataset
        from workloads.model.loading import load_model, load_tokenizer

        self.task, self.env = task, env
        self.records = load_dataset(task.dataset)
        self.tokenizer = load_tokenizer(task.model)
        self.model = load_model(task.model, dtype=torch.bfloat16)
        self.layers = int(self.model.config.num_hidden_layers)
        self._verdicts: OrderedDict[str, tuple[bool, int | None, list[str]]] = OrderedDict()
        self.keep = keep

    def judge(self, path: Path, submission: Submission) -> Verdict:
        from workloads.pipeline.files import GroupFileError, read_group_file, row_keys

        started = time.perf_counter()

        def verdict(kind: VerdictKind, reasons: list[str], rows: int = 0, tokens: int = 0) -> Verdict:
            return Verdict(file=str(path), verdict=kind, reasons=reasons, rows=rows, tokens=tokens,
                           seconds=round(time.perf_counter() - started, 6))  # fmt: skip

        path = Path(path)
        if not path.is_file():
            return verdict("soft_invalidate", [f"file: {path} does not exist"])
        raw_size = path.stat().st_size
        if raw_size > self.env.max_file_bytes:
            limit = self.env.max_file_bytes
            return verdict("soft_invalidate", [f"file: {raw_size} bytes, over the {limit}-byte limit"])
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        want = (submission.work_key or "").lower().removeprefix("0x")
        if want and want != sha:
            return verdict("soft_invalidate", [f"file: sha256 {sha} is not the work key 0x{want} on chain"])
        try:
            data = read_group_file(path, self.env.max_file_bytes)
        except GroupFileError as exc:
            return verdict("invalidate", [f"schema: {exc}"])
        rows, tokens = len(data.prompts), data.output_tokens()
        reasons = self._task_rules(data, submission)
        if self.env.seen.file_seen(submission.pool_id, sha):
            reasons.append("duplicates: this file was already submitted")
        keys = row_keys(data)
        if self.env.seen.rows_seen(submission.pool_id, keys):
            reasons.append("duplicates: a row of this batch at this stage was already paid")
        if reasons:
            self.env.seen.remember(submission.pool_id, sha, keys)
            return verdict("invalidate", reasons, rows, tokens)
        accepted, blamed, why = self._group_verdict(data)
        self.env.seen.remember(submission.pool_id, sha, keys)
        if accepted:
            return verdict("accept", [], rows, tokens)
        if blamed == data.stage:
            return verdict("invalidate", why, rows, tokens)
        whom = f"member {blamed} ({data.members[blamed]})" if blamed is not None else "no member"
        return verdict("soft_invalidate", [f"group: the batch failed and {whom} was blamed: "
                                           f"{'; '.join(why)}"], rows, tokens)  # fmt: skip

    def _task_rules(self, data: Any, submission: Submission) -> list[str]:
        """What the member controls (its task, address, layers, claim, model) and what stage 0 decided
        (`driver_problems`). The latter is the submitter's fault too, whatever its stage: every member
        runs the same check on the bundle before writing its file, so an honest member never holds a
        file that fails it (a driver breaking the rules stops the group instead)."""
        from workloads.pipeline.files import driver_problems
        from workloads.pipeline.stages import split_layers

        t, own = self.task, []
        if self.env.task_id and data.task_id != self.env.task_id:
            own.append(f"task: the file is for task {data.task_id!r}, not {self.env.task_id!r}")
        if submission.node and data.node.lower() != submission.node.lower():
            own.append(f"identity: stage {data.stage}'s member is {data.node}, not the submitter "
                       f"{submission.node}")  # fmt: skip
        if data.model != t.model or data.max_new_tokens != t.max_new_tokens:
            own.append(f"bounds: model {data.model!r} / max_new_tokens {data.max_new_tokens}, the task's are "
                       f"{t.model!r} / {t.max_new_tokens}")  # fmt: skip
        if len(data.members) > self.layers:
            return own + [f"bounds: {len(data.members)} members for {self.layers} layers"]
        split = split_layers(self.layers, len(data.members))[data.stage]
        if tuple(data.layers) != (split.start, split.stop):
            own.append(f"bounds: stage {data.stage} names layers {data.layers}, its share is "
                       f"{(split.start, split.stop)}")  # fmt: skip
        if submission.work_units is not None and submission.work_units > data.work_units(self.layers):
            own.append(f"work_units: {submission.work_units} claimed, the file is worth "
                       f"{data.work_units(self.layers)}")  # fmt: skip
        driver = driver_problems(
            task_id=data.task_id, group_id=data.group_id, members=data.members, batch=data.batch,
            batches=t.batches, batch_size=t.batch_size, max_new_tokens=t.max_new_tokens,
            temperature=t.temperature, bundle=data.bundle(), dataset_size=len(self.records),
            prompt_of=lambda i: list(self.tokenizer(self.records[i].prompt)["input_ids"]),
        )  # fmt: skip
        return own + driver

    def _group_verdict(self, data: Any) -> tuple[bool, int | None, list[str]]:
        from workloads.pipeline.stages import StagePlan, split_layers
        from workloads.pipeline.verify import GroupRows, judge_group

        key = hashlib.sha256(repr((data.group_id, data.batch, data.members, data.prompts, data.outputs,
                                   data.logprobs, data.stage_proofs)).encode()).hexdigest()  # fmt: skip
        if key in self._verdicts:
            self._verdicts.move_to_end(key)
            return self._verdicts[key]
        bundle = data.bundle()
        count = len(data.members)
        plans = [StagePlan(i, count, r) for i, r in enumerate(split_layers(self.layers, count))]
        rows = GroupRows(bundle.prompts, bundle.outputs, bundle.logprobs, bundle.seeds, bundle.stage_proofs,
                         bundle.temperature)  # fmt: skip
        found = judge_group(self.model, plans, rows, int(self.tokenizer.pad_token_id or 0))
        result = (found.accepted, found.blamed, list(found.reasons))
        self._verdicts[key] = result
        while len(self._verdicts) > self.keep:
            self._verdicts.popitem(last=False)
        return result
