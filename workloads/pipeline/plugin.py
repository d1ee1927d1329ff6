"""The pipeline-group workload as a plug-in of the workload seam (`intellect.workloads`, name `pipeline`).

A task `{"workload": {"type": "pipeline", "settings": {...}}, "allowed_topologies": ["2x0GB"]}` runs
one stage per member of a node group (`task.py`). Settings are checked when the task is POSTed (422
naming the setting): their types and ranges, a group topology present, every topology's member count
at most the model's layers.

Crediting rule: each member submits its own copy of the batch's file, naming its stage, for its share
of the work: the batch's output tokens × its layers / the model's layers, rounded up (`GroupFile.
work_units`), stated with every other member's in the file's receipt (`files.group_receipt`), which
the judge holds to the file and `intellect-pool audit --group` reads. Judging (`PipelineJudge`): the
batch is judged once (one prefill, `verify.judge_group`), then each member's file gets its verdict:
the whole batch accepted → every member paid; a member blamed → its file `invalidate` (slashed by the
quorum), every other member's `soft_invalidate` (not paid, the batch was bad; never slashed); nobody
blamed → everyone's `soft_invalidate`.

A batch accepted chunk by chunk is then judged over the member's window (`pooled.py`): its recent
files of the same group, pooled per stage, catch a perturbation no single small file shows; the same
verdicts follow (the member blamed over the window `invalidate`, the others `soft_invalidate`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from intellect.wire.tasks import TaskSpec
from intellect.wire.verdicts import Submission, Verdict, VerdictKind
from intellect.workloads import (
    FileJudge,
    NodeWindows,
    ValidatorEnv,
    WorkloadSettingsError,
    judged_again,
    runs_module,
    with_program,
)
from workloads.pipeline.options import CHEATS, ENV_PREFIX

WORKLOAD = "pipeline"  # this plug-in's name: the one its calibration records name too

if TYPE_CHECKING:
    from workloads.pipeline.pooled import PooledVerdict
    from workloads.pipeline.replay import MemberVerdict
    from workloads.pipeline.verify import StageStats

IMAGE = "intellect-workload:latest"
ENTRYPOINT = ["python3", "-m", "workloads.pipeline.task"]
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


class PipelineSettings(BaseModel):
    """`workload.settings` of a pipeline task (the trainer's part; the group's comes from the worker)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("tiny", max_length=500)
    dataset: str = Field("reverse", max_length=500)
    batch_size: int = Field(8, ge=1, le=256)
    n: int = Field(1, ge=1, le=64, description="completions per prompt (GRPO group size)")
    batches: int = Field(4, ge=1, le=100_000)
    max_new_tokens: int = Field(32, ge=1, le=4096)
    temperature: float = Field(1.0, gt=0, le=10)
    target_lengths: list[int] = Field([8], min_length=1, max_length=64)
    length_penalty: float = Field(0.0, ge=0)
    timeout_seconds: float = Field(60.0, gt=0, le=3600)
    in_flight: int = Field(1, ge=1, le=64, description="batches the group keeps moving at once (slow links)")
    draft: str = Field("none", max_length=500, pattern=r"^(none|prompt-lookup|model:.+)$",
                       description="the driver's guesses the group checks in one trip (exact: the same "
                       "files as without): none, prompt-lookup or model:<name or folder>")
    draft_tokens: int = Field(4, ge=0, le=15)
    # Following a trainer (an RL run): see task.py and policy.py.
    step_url: str | None = Field(None, max_length=2000)
    checkpoint_source: str | None = Field(None, max_length=4000)
    async_level: int = Field(2, ge=0, le=64)
    poll_seconds: float = Field(2.0, gt=0, le=600)
    files_per_step: int = Field(0, ge=0, le=100_000)
    step_patience_seconds: float = Field(20.0, gt=0, le=3600)
    cheat: str = Field("none", description="demos and tests only")
    cheat_stage: int = Field(-1, ge=-1, le=63)

    @model_validator(mode="after")
    def _follow_both(self) -> PipelineSettings:
        # A driver following the trainer's step with no checkpoints would name the base model for every
        # step: outside the async window as soon as the trainer moves, so no member would ever write.
        if bool(self.step_url) != bool(self.checkpoint_source):
            raise ValueError("step_url and checkpoint_source go together (following a trainer needs both)")
        if self.files_per_step and self.step_patience_seconds >= self.timeout_seconds:
            raise ValueError("step_patience_seconds must stay below timeout_seconds (the members wait for "
                             "the driver)")  # fmt: skip
        return self


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


# A batch's group verdict, kept for its other members' files: accepted, the stage blamed, why, and
# every stage's statistics (what the windows pool).
_BatchVerdict = tuple[bool, int | None, list[str], list["StageStats"]]


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
        """A task naming no workload that runs the member program is a pipeline task."""
        return runs_module(spec, "workloads.pipeline.task")

    def render(self, spec: TaskSpec, settings: BaseModel) -> TaskSpec:
        return with_program(spec, dict(spec.env_vars) | _member_env(settings), IMAGE, ENTRYPOINT)

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
        # The trainer's checkpoints as the validator (the host) knows them, step 0 the task's base model;
        # the model holds one checkpoint at a time, loaded when a batch names another.
        from workloads.model.loading import ModelCheckpoints

        self.checkpoints = ModelCheckpoints(task.model, env.checkpoints)
        base = ModelCheckpoints(task.model).checkpoint_for(0)
        self._holds: tuple[int, str] | None = (0, base[1]) if base else None
        self._verdicts: OrderedDict[str, _BatchVerdict] = OrderedDict()
        self.keep = keep
        self.windows: NodeWindows = env.windows
        # The replay's limits (verify.GroupThresholds, replay.ForwardLimits) were measured on the tiny
        # model only: on a model whose record does not name this workload, what the replay finds is at
        # most "not paid", never a slash (calibration.resolve_limits, the one place that says).
        from workloads.inference.judge.calibration import resolve_limits

        self.limits = resolve_limits(task.model)
        self.calibrated = self.limits.calibrated(WORKLOAD)
        from workloads.pipeline.tolerance import ForwardLimits

        # The record's; on a model no record calibrates, the tiny model's per-position rules alone (the
        # file rules' figures are one model's: on another they could leave honest files unpaid).
        self.forward = ForwardLimits.from_record(self.limits.forward)
        if not self.calibrated:
            self.forward = self.forward.per_position()

    def _measured(self, reasons: list[str]) -> tuple[VerdictKind, list[str]]:
        """A failure of the replay's measured limits: slashed only on a calibrated model."""
        if self.calibrated:
            return "invalidate", reasons
        why = f" [no pipeline calibration for model {self.task.model!r}: not paid, not slashed]"
        return "soft_invalidate", [r + why for r in reasons]

    def judge(self, path: Path, submission: Submission) -> Verdict:
        from workloads.pipeline.files import GroupFileError, read_group_file, row_keys

        started = time.perf_counter()

        def verdict(kind: VerdictKind, reasons: list[str], rows: int = 0, tokens: int = 0) -> Verdict:
            return Verdict(file=str(path), verdict=kind, reasons=reasons, rows=rows, tokens=tokens,
                           seconds=round(time.perf_counter() - started, 6),
                           judged_by=self.limits.judged_by(WORKLOAD))  # fmt: skip

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
        hard, soft, drivers = self._policy_rules(data, submission)
        reasons += hard + (drivers if data.stage == 0 else [])
        if not reasons:
            reasons += self._reward_problems(data)
        again = judged_again(self.env.seen, submission.pool_id, sha)  # a retry: its rows are its own
        if not again and self.env.seen.file_seen(submission.pool_id, sha):
            reasons.append("duplicates: this file was already submitted")
        keys = row_keys(data)
        if not again and self.env.seen.rows_seen(submission.pool_id, keys):
            reasons.append("duplicates: a row of this batch at this stage was already paid")
        if reasons:
            self.env.seen.remember(submission.pool_id, sha, keys)
            return verdict("invalidate", reasons, rows, tokens)
        if drivers:  # the driver's choice of step, which no other member could check: not paid
            driven = f"group: the driver (stage 0) made the batch for a step it could not have: {drivers[0]}"
            return verdict("soft_invalidate", [driven], rows, tokens)
        if soft:  # what depends on this validator's timing, or a checkpoint it cannot have: never slashed
            return verdict("soft_invalidate", soft, rows, tokens)
        key, (accepted, _hint, why, stats) = self._group_verdict(data)
        self.env.seen.remember(submission.pool_id, sha, keys)
        # Blame is local (`replay.py`): this member's stage replayed from what it received, never from
        # what an honest predecessor would have sent; the end-to-end check above only says whether the
        # batch is right (and so paid), never who is guilty.
        local = self._member_verdict(data)
        if local.guilty:
            if local.exact:  # its own frames against what it signed: no measured limit decides it
                return verdict("invalidate", local.reasons, rows, tokens)
            return verdict(*self._measured(local.reasons), rows, tokens)
        if accepted and not local.proven and data.links:
            # A disputed or foreign link record, or frames that contradict the batch: the evidence cannot
            # say who did what, so neither end of that link is paid (nor slashed). Files without link
            # records (format 2, before seals) are still paid end to end.
            return verdict("soft_invalidate", [f"{r}: not paid" for r in local.reasons], rows, tokens)
        if accepted:
            batch, own = self._pooled_verdict(data, submission, key, stats, local)
            if own.out:
                return verdict(*self._measured(own.reasons), rows, tokens)
            if batch.out:  # the group's figures are out, but not this member's own: not paid
                return verdict("soft_invalidate", batch.reasons, rows, tokens)
            return verdict("accept", [], rows, tokens)
        innocent = ("its own stage follows from what it received" if local.proven
                    else "; ".join(local.reasons))  # fmt: skip
        return verdict("soft_invalidate", [f"group: the batch failed end to end ({'; '.join(why)}); this "
                                           f"member is not to blame: {innocent}"], rows, tokens)  # fmt: skip

    def _task_rules(self, data: Any, submission: Submission) -> list[str]:
        """What the member controls (its task, address, layers, claim, model) and what stage 0 decided
        (`driver_problems`). The latter is the submitter's fault too, whatever its stage: every member
        runs the same check on the bundle before writing its file, so an honest member never holds a
        file that fails it (a driver breaking the rules stops the group instead)."""
        from workloads.pipeline.files import driver_problems, receipt_problems
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
        own += receipt_problems(data, self.layers)  # what the pool owner's audit will read of the batch
        driver = driver_problems(
            task_id=data.task_id, group_id=data.group_id, members=data.members, batch=data.batch,
            batches=t.batches, batch_size=t.batch_size, n=t.n, target_lengths=t.target_lengths,
            max_new_tokens=t.max_new_tokens,
            temperature=t.temperature, bundle=data.bundle(), dataset_size=len(self.records),
            prompt_of=lambda i: list(self.tokenizer(self.records[i].prompt)["input_ids"]),
        )  # fmt: skip
        return own + driver

    def _policy_rules(self, data: Any, submission: Submission) -> tuple[list[str], list[str], list[str]]:
        """(the submitter's fault, unverifiable, the driver's alone) about the batch's policy. Every member
        checks the checkpoint's window and loads the checkpoint by its sha256 (`policy_problems`,
        `Policies.stage`), so a file failing those is its own fault; whether the batch's step was ahead
        of the trainer's only the driver could know; a step behind the window at submission (the
        earliest the trainer may have been at), or a checkpoint this validator can no longer fetch, is
        no proof of anything (soft)."""
        from workloads.pipeline.files import policy_problems

        level, trainer, step = self.task.async_level, submission.trainer_step, data.step
        hard, soft, drivers = policy_problems(data.policy, level), [], []
        if data.n != self.task.n:
            hard.append(f"bounds: n={data.n} completions per prompt, the task's is {self.task.n}")
        if trainer is not None and step > trainer:
            drivers.append(f"freshness: step {step} is ahead of the trainer's step {trainer} at submission")
        earliest = trainer if submission.trainer_step_before is None else submission.trainer_step_before
        if earliest is not None and step < earliest - level:
            soft.append(f"freshness: step {step} is behind the trainer's window [{earliest - level}, "
                        f"{earliest}] at submission")  # fmt: skip
        known = self.checkpoints.checkpoint_for(data.checkpoint_step)
        if known is None:
            soft.append(f"freshness: no checkpoint of step {data.checkpoint_step} can be had from the "
                        "trainer")  # fmt: skip
        elif data.checkpoint_sha256 != known[1]:
            hard.append(f"freshness: checkpoint sha256 {str(data.checkpoint_sha256)[:16]}… is not step "
                        f"{data.checkpoint_step}'s {known[1][:16]}…")  # fmt: skip
        return hard, soft, drivers

    def _reward_problems(self, data: Any) -> list[str]:
        """Each member scores the batch itself when it writes its file (the verifiers are deterministic):
        rewards, penalties, advantages or problem ids that are not the task's are its own file's fault."""
        from workloads.inference.generate import completion_text
        from workloads.pipeline.files import plan_group_batch, score_rows

        t = self.task
        plan = plan_group_batch(data.task_id, data.group_id, list(data.members), data.batch,
                                len(self.records), t.batch_size, t.n, t.target_lengths)  # fmt: skip
        texts = [completion_text(self.tokenizer, o) for o in data.outputs]
        want = score_rows(self.records, plan, texts, [len(o) for o in data.outputs], t.length_penalty)
        floats = ("task_rewards", "length_penalties", "rewards", "advantages")
        exact = ("problem_ids", "task_types", "target_lengths")
        bad = [r for r in range(len(texts))
               if any(abs(getattr(data, f)[r] - getattr(want, f)[r]) > 1e-4 for f in floats)
               or any(getattr(data, f)[r] != getattr(want, f)[r] for f in exact)]  # fmt: skip
        if bad:
            return [f"rewards: rows {bad[:8]} carry rewards, advantages or problem ids that are not what the "
                    "task's verifier gives"]  # fmt: skip
        return []

    def _load(self, checkpoint_step: int) -> None:
        """The batch's checkpoint in the model (fetched and sha256-checked by `_policy_rules` already)."""
        from workloads.model.loading import load_weights

        known = self.checkpoints.checkpoint_for(checkpoint_step)
        if known is None:
            raise RuntimeError(f"the checkpoint of step {checkpoint_step} went away while judging")
        if self._holds != (checkpoint_step, known[1]):
            load_weights(self.model, known[0])
            self._holds = (checkpoint_step, known[1])

    def _pooled_verdict(self, data: Any, submission: Submission, key: str, stats: list[StageStats],
                        local: MemberVerdict) -> tuple[PooledVerdict, PooledVerdict]:  # fmt: skip
        """This member's window, fed with this batch (its own file, every other check passed, the batch
        accepted end to end: `pooled.py` says why only such files feed it), pooled over its files of
        this group: (the batch's end-to-end figures, whose rule can make a batch unpaid but blames
        nobody; its own stage against the replay of what it received, whose rule blames it)."""
        from workloads.pipeline.pooled import (
            POOL_FILES,
            PooledVerdict,
            group_key,
            pool,
            pool_own,
            pooled_blame,
            pooled_own,
            window_entry,
        )

        group = group_key(data.task_id, data.group_id, list(data.members))
        entry = window_entry(group, data.stage, key, stats, local.stats if local.proven else None)
        window = self.windows.push(submission.pool_id, data.node, entry, POOL_FILES)
        pooled, files = pool(window, group, data.stage)
        batch = pooled_blame(pooled, files)
        if batch.out:  # no blame from end-to-end figures: an earlier member's lie is in them
            batch = PooledVerdict(None, True, [f"{r}: the batch is not paid" for r in batch.reasons[:1]])
        if not local.proven:  # no replay of its own: nothing of its own to pool
            return batch, PooledVerdict()
        own, own_files = pool_own(window, group, data.stage)
        return batch, pooled_own(own, data.stage, data.stage == len(data.members) - 1, own_files)

    def _member_verdict(self, data: Any) -> MemberVerdict:
        """This member judged on its own evidence (`replay.judge_member`), with the batch's checkpoint."""
        from workloads.pipeline.replay import judge_member
        from workloads.pipeline.stages import StagePlan, split_layers

        self._load(data.checkpoint_step)
        count = len(data.members)
        plans = [StagePlan(i, count, r) for i, r in enumerate(split_layers(self.layers, count))]
        received, sent = data.frames()
        return judge_member(self.model, plans, data.stage, data.bundle(), received, sent,
                            task_id=data.task_id, group_id=data.group_id, batch=data.batch,
                            eos=int(self.tokenizer.eos_token_id), pad=int(self.tokenizer.pad_token_id or 0),
                            max_new_tokens=data.max_new_tokens, limits=self.forward)  # fmt: skip

    def _group_verdict(self, data: Any) -> tuple[str, _BatchVerdict]:
        from workloads.pipeline.stages import StagePlan, split_layers
        from workloads.pipeline.verify import GroupRows, judge_group

        key = hashlib.sha256(repr((data.group_id, data.batch, data.members, data.prompts, data.outputs,
                                   data.logprobs, data.stage_proofs, data.checkpoint_step,
                                   data.checkpoint_sha256)).encode()).hexdigest()  # fmt: skip
        if key in self._verdicts:
            self._verdicts.move_to_end(key)
            return key, self._verdicts[key]
        self._load(data.checkpoint_step)
        bundle = data.bundle()
        count = len(data.members)
        plans = [StagePlan(i, count, r) for i, r in enumerate(split_layers(self.layers, count))]
        rows = GroupRows(bundle.prompts, bundle.outputs, bundle.logprobs, bundle.seeds, bundle.stage_proofs,
                         bundle.temperature)  # fmt: skip
        found = judge_group(self.model, plans, rows, int(self.tokenizer.pad_token_id or 0))
        result = (found.accepted, found.blamed, list(found.reasons), list(found.stage_stats))
        self._verdicts[key] = result
        while len(self._verdicts) > self.keep:
            self._verdicts.popitem(last=False)
        return key, result
