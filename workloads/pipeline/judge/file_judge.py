"""How a validator judges one member's file of a pipeline task (`PipelineJudge`, the `FileJudge` the
plug-in's `file_judge` hands its host).

In the order a file meets them, cheapest first: the file itself (size, sha256 against the work key,
the schema, capped before parsing); the task's rules (task, submitter, model, lengths, the stage's
layer share, the units claimed, the receipt, the driver's plan: `files.py`); the batch's policy against
the trainer; the rewards; the validator's memory of paid files and rows. Then the batch is judged once
end to end (`end_to_end.judge_group`, one prefill, kept for the other members' files), the member
locally from its own evidence (`replay.judge_member`), and an accepted batch once more over the
member's window (`pooled.py`):
the whole batch accepted → every member paid; a member blamed → its file `invalidate` (slashed by the
quorum), every other member's `soft_invalidate` (not paid, the batch was bad; never slashed); nobody
blamed → everyone's `soft_invalidate`. Failures of measured limits slash only on a model whose
calibration record names the `pipeline` workload (`_measured`).
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from intellect.wire.verdicts import Submission, Verdict, VerdictKind
from intellect.workloads import NodeWindows, ValidatorEnv, judged_again
from workloads.pipeline.options import WORKLOAD
from workloads.pipeline.settings import PipelineSettings

if TYPE_CHECKING:
    from workloads.pipeline.judge.end_to_end import StageStats
    from workloads.pipeline.judge.pooled import PooledVerdict
    from workloads.pipeline.judge.replay import MemberVerdict

# A batch's group verdict, kept for its other members' files: accepted, the stage blamed, why, and
# every stage's statistics (what the windows pool).
_BatchVerdict = tuple[bool, int | None, list[str], list["StageStats"]]


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
        # The replay's limits (end_to_end.GroupThresholds, replay.ForwardLimits) were measured on the tiny
        # model only: on a model whose record does not name this workload, what the replay finds is at
        # most "not paid", never a slash (calibration.resolve_limits, the one place that says).
        from workloads.inference.judge.calibration import resolve_limits

        self.limits = resolve_limits(task.model)
        self.calibrated = self.limits.calibrated(WORKLOAD)
        from workloads.pipeline.judge.tolerance import ForwardLimits

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
        from workloads.pipeline.judge.pooled import (
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
        from workloads.pipeline.judge.replay import judge_member
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
        from workloads.pipeline.judge.end_to_end import GroupRows, judge_group
        from workloads.pipeline.stages import StagePlan, split_layers

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
