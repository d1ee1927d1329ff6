"""A group batch as a file: what each member uploads and a validator judges.

Every member of a group writes the same batch (the `GroupBundle` that went round the ring) into its
own file, naming its own stage; each submits its file on chain for its share of the work. The batch's
prompts and seeds derive from (task, group, members, batch number) (`plan_group_batch`), so a node
outside the group cannot re-sign a member's file as its own: changing the member list changes the
seeds the validator expects.

The format is JSON (`GroupFile`): a group batch is small (token ids, one 258-byte proof per 32
positions per row and stage) and its whole shape is fixed, so a size cap before parsing and the
schema bound it completely (no nesting the schema does not name). Its rows carry every field of the
single-node rollout schema (`workloads/rollouts.py`: rewards, advantages, the policy's step and
checkpoint, problem ids, …), rows prompt-major in groups of `n` completions, so the trainer takes a
group's batch like any rollout file (`to_rollouts`); the extra is the member list and every stage's
proofs.

Format 3 adds what makes blame local (`commit.py`, `judge.replay.judge_member`): every link's record (the
sender's signed digest of the frames it sent, the receiver's countersigned digest of what it got),
and this member's own frames of the batch, exactly as they crossed its links (base64): what it
received and what it sent. A validator checks them against the records and replays the member's
stage from what it received. They are the bulk of the file: the tiny model's 8-row batch of 32 tokens
is about 0.2 MB a direction; a model with 4,096-wide activations would make them 32× that, which
the file cap (`MAX_FILE_BYTES`, and the validator's own) bounds.

Format 4 adds the batch's receipt (`intellect.wire.receipts.GroupReceipt`, `group_receipt`): every
member, the stage and layers it ran, the units its file is worth, the digests of what it received and
sent. It restates what the file already proves, in the one shape the pool owner's audit reads
(`intellect-pool audit --group`); the judge holds it to the file (`receipt_problems`).
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from intellect.wire.base import TooLarge, first_error, read_capped
from intellect.wire.receipts import GroupReceipt, StageReceipt
from workloads.inference.generate import rewards_for
from workloads.inference.selection import SEED_HIGH, BatchPlan
from workloads.pipeline.bundle import GroupBundle, Policy
from workloads.pipeline.commit import LinkRecord
from workloads.rollouts import BatchInfo, Rollout
from workloads.verifiers import TaskRecord

FORMAT = "intellect-pipeline-batch/4"
# Format 2 (no link records, no frames) is still read: a file a member made before its worker was
# upgraded is judged end to end as before and can be paid, but proves nobody's fault (never slashed).
# Format 3 is format 4 without a receipt: judged as before, but the audit cannot read it.
READ_FORMATS = r"^intellect-pipeline-batch/[234]$"
MAX_FILE_BYTES = 64 * 1024 * 1024


class GroupFileError(ValueError):
    """The file cannot be read as a group batch; `str()` says why."""


class LinkEntry(BaseModel):
    """A `commit.LinkRecord` in the file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sender: int = Field(ge=0, le=63)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    signature: str = Field(max_length=200)
    received_sha256: str = Field(pattern=r"^([0-9a-f]{64})?$")
    countersignature: str = Field(max_length=200)


class GroupFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: str = Field(pattern=READ_FORMATS)
    task_id: str = Field(max_length=200)
    group_id: str = Field(max_length=200)
    batch: int = Field(ge=1)
    stage: int = Field(ge=0)
    layers: tuple[int, int]
    model: str = Field(max_length=500)
    members: list[str] = Field(min_length=1, max_length=64)
    prompts: list[list[int]] = Field(min_length=1, max_length=4096)
    outputs: list[list[int]]
    logprobs: list[list[float]]
    seeds: list[int]
    temperature: float = Field(gt=0)
    max_new_tokens: int = Field(ge=1)
    stage_proofs: list[list[str]]
    # The rollout schema's per-row fields (rows prompt-major, `n` completions per prompt).
    n: int = Field(ge=1)
    step: int = Field(ge=0)
    checkpoint_step: int = Field(ge=0)
    checkpoint_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    problem_ids: list[str]
    task_types: list[str]
    target_lengths: list[int]
    task_rewards: list[float]
    length_penalties: list[float]
    rewards: list[float]
    advantages: list[float]
    links: list[LinkEntry] = Field(default_factory=list, max_length=63)
    # This member's frames of the batch as they crossed its links: per frame its parts, base64.
    received_frames: list[list[str]] = Field(default_factory=list, max_length=1 << 16)
    sent_frames: list[list[str]] = Field(default_factory=list, max_length=1 << 16)
    receipt: GroupReceipt | None = None  # format 4 on

    @property
    def node(self) -> str:
        return self.members[self.stage]

    @property
    def version(self) -> int:
        return int(self.format.rsplit("/", 1)[1])

    @property
    def policy(self) -> Policy:
        return Policy(self.step, self.checkpoint_step, self.checkpoint_sha256)

    def bundle(self) -> GroupBundle:
        proofs = [[bytes.fromhex(p) for p in stage] for stage in self.stage_proofs]
        links = [LinkRecord(**entry.model_dump()) for entry in self.links]
        return GroupBundle(list(self.members), [list(p) for p in self.prompts],
                           [list(o) for o in self.outputs], [list(lp) for lp in self.logprobs],
                           list(self.seeds), self.temperature, proofs, self.policy, links)  # fmt: skip

    def frames(self) -> tuple[list[list[bytes]], list[list[bytes]]]:
        """(received, sent): this member's frames of the batch, as bytes."""
        def decode(frames: list[list[str]]) -> list[list[bytes]]:
            return [[base64.b64decode(part, validate=True) for part in parts] for parts in frames]

        return decode(self.received_frames), decode(self.sent_frames)

    def to_rollouts(self) -> tuple[list[Rollout], BatchInfo]:
        """The batch as rollout rows, as the trainer reads any rollout file; each row's proof is the last
        stage's (a single node's proof of the same tokens)."""
        last = [bytes.fromhex(p) for p in self.stage_proofs[-1]]
        rows = [Rollout(input_tokens=self.prompts[i], output_tokens=self.outputs[i],
                        output_logprobs=self.logprobs[i], advantages=self.advantages[i],
                        rewards=self.rewards[i], task_rewards=self.task_rewards[i],
                        length_penalties=self.length_penalties[i], proofs=last[i], step=self.step,
                        target_lengths=self.target_lengths[i], task_type=self.task_types[i],
                        seed=self.seeds[i], temperature=self.temperature, problem_id=self.problem_ids[i])
                for i in range(len(self.prompts))]  # fmt: skip
        info = BatchInfo(node_address=self.members[0], step=self.step, batch_counter=self.batch,
                         group_size=self.n, max_new_tokens=self.max_new_tokens, model=self.model,
                         checkpoint_step=self.checkpoint_step, checkpoint_sha256=self.checkpoint_sha256,
                         task_id=self.task_id)  # fmt: skip
        return rows, info

    def output_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    def work_units(self, total_layers: int) -> int:
        """This member's share (`share_units`)."""
        return share_units(self.output_tokens(), self.layers, total_layers)


def share_units(tokens: int, layers: tuple[int, int], total_layers: int) -> int:
    """A member's share of a batch: its output tokens × the member's layers / the model's layers, rounded
    up (every stage processed every token; the shares add up to at least one node's claim)."""
    start, stop = layers
    return math.ceil(tokens * (stop - start) / max(1, total_layers))


def group_receipt(data: GroupFile, total_layers: int) -> GroupReceipt:
    """The batch's receipt as `data`'s member states it: the task's layer split of a `total_layers` model,
    each member's share of the batch's tokens, and the digests its link records commit (what stage s
    received is link s-1's receiver digest, what it sent link s's sender digest)."""
    from workloads.pipeline.stages import split_layers

    links = {entry.sender: entry for entry in data.links}
    tokens = data.output_tokens()
    members = []
    for stage, (node, span) in enumerate(zip(data.members, split_layers(total_layers, len(data.members)),
                                             strict=True)):  # fmt: skip
        layers = (span.start, span.stop)
        got, sent = links.get(stage - 1), links.get(stage)
        members.append(StageReceipt(stage=stage, node=node, layers=layers,
                                    units=share_units(tokens, layers, total_layers),
                                    received_sha256=got.received_sha256 if got else "",
                                    sent_sha256=sent.sha256 if sent else ""))  # fmt: skip
    return GroupReceipt(task_id=data.task_id, group_id=data.group_id, batch=data.batch, model=data.model,
                        model_layers=total_layers, output_tokens=tokens, stage=data.stage,
                        members=members)  # fmt: skip


def receipt_problems(data: GroupFile, total_layers: int) -> list[str]:
    """What is wrong with the file's receipt (format 4 on: none is wrong only before it). A member writes
    it from its own file with `group_receipt`, so an honest member's receipt never differs."""
    if data.receipt is None:  # format 3 or before (`read_group_file` refuses a later one without)
        return []
    try:
        want = group_receipt(data, total_layers)
    except ValueError as exc:  # a member list the split cannot serve (judged as bounds already)
        return [f"receipt: {exc}"]
    if data.receipt == want:
        return []
    given, wanted = data.receipt.model_dump(), want.model_dump()
    wrong = [name for name in wanted if name != "members" and given[name] != wanted[name]]
    for mine, right in zip(given["members"], wanted["members"], strict=False):
        wrong += [f"stage {right['stage']} {name}" for name in right if mine[name] != right[name]]
    if len(given["members"]) != len(wanted["members"]):
        wrong.append(f"{len(given['members'])} members")
    return [f"receipt: it does not state the file's batch: {', '.join(wrong[:6])}"]


@dataclass(frozen=True)
class Scores:
    """The batch's rewards, per row, as the single-node workload computes them (`score_rows`)."""

    problem_ids: list[str]
    task_types: list[str]
    target_lengths: list[int]
    task_rewards: list[float]
    length_penalties: list[float]
    rewards: list[float]
    advantages: list[float]


def score_rows(records: list[TaskRecord], plan: BatchPlan, texts: list[str], lengths: list[int],
               length_penalty: float) -> Scores:  # fmt: skip
    """Every member (and every validator) scores the batch alike: the verifiers are deterministic."""
    tasks = [records[i] for i in plan.indexes]
    targets = [t for t in plan.target_lengths for _ in range(plan.n)]
    task_rewards, penalties, rewards, advantages = rewards_for(
        tasks, texts, lengths, targets, plan.n, length_penalty)  # fmt: skip
    return Scores([tasks[r // plan.n].problem_id for r in range(len(texts))],
                  [tasks[r // plan.n].task_type for r in range(len(texts))], targets,
                  task_rewards, penalties, rewards, advantages)  # fmt: skip


def file_name(batch: int, stage: int) -> str:
    """A member's file of a batch, in its data dir: by it a restarted member finds the batches it already
    holds (the driver goes on from the first it lacks; nobody announces a batch twice)."""
    return f"pipeline-batch{batch:06d}-stage{stage}.json"


def write_group_file(path: Path, *, task_id: str, group_id: str, batch: int, stage: int,
                     layers: tuple[int, int], model: str, max_new_tokens: int, bundle: GroupBundle,
                     n: int, scores: Scores, total_layers: int,
                     received_frames: list[list[bytes]] | None = None,
                     sent_frames: list[list[bytes]] | None = None) -> GroupFile:  # fmt: skip
    """The member's file of the batch, written whole or not at all (`total_layers`: the model's); what it
    holds, so the caller need not read it back."""
    policy = bundle.policy

    def encode(frames: list[list[bytes]] | None) -> list[list[str]]:
        return [[base64.b64encode(part).decode() for part in parts] for parts in frames or []]

    data = GroupFile(
        format=FORMAT, task_id=task_id, group_id=group_id, batch=batch, stage=stage, layers=layers,
        model=model,
        members=bundle.members, prompts=bundle.prompts, outputs=bundle.outputs, logprobs=bundle.logprobs,
        seeds=bundle.seeds, temperature=bundle.temperature, max_new_tokens=max_new_tokens,
        stage_proofs=[[p.hex() for p in stage] for stage in bundle.stage_proofs],
        n=n, step=policy.step, checkpoint_step=policy.checkpoint_step,
        checkpoint_sha256=policy.checkpoint_sha256, problem_ids=scores.problem_ids,
        task_types=scores.task_types, target_lengths=scores.target_lengths,
        task_rewards=scores.task_rewards, length_penalties=scores.length_penalties, rewards=scores.rewards,
        advantages=scores.advantages, links=[LinkEntry(**r.header()) for r in bundle.links],
        received_frames=encode(received_frames), sent_frames=encode(sent_frames),
    )  # fmt: skip
    data = data.model_copy(update={"receipt": group_receipt(data, total_layers)})
    part = path.with_name(path.name + ".part")
    part.write_text(data.model_dump_json())
    part.replace(path)  # a crash never leaves half a file under the name the uploader picks up
    return data


def read_group_file(path: Path, max_bytes: int = MAX_FILE_BYTES) -> GroupFile:
    try:
        raw = read_capped(path, max_bytes, "a group batch")
    except TooLarge as exc:
        raise GroupFileError(str(exc)) from None
    except OSError as exc:
        raise GroupFileError(f"cannot read it: {exc}") from None
    try:
        data = GroupFile.model_validate_json(raw)
    except ValidationError as exc:
        raise GroupFileError(f"not a group batch: {first_error(exc)}") from None
    rows = len(data.prompts)
    per_row = (data.outputs, data.logprobs, data.seeds, data.problem_ids, data.task_types,
               data.target_lengths, data.task_rewards, data.length_penalties, data.rewards,
               data.advantages)  # fmt: skip
    if any(len(column) != rows for column in per_row):
        raise GroupFileError("the per-row fields (outputs, logprobs, seeds, rewards, …) differ in count")
    if rows % data.n or any(data.prompts[r] != data.prompts[r - r % data.n] for r in range(rows)):
        raise GroupFileError(f"{rows} rows are not groups of n={data.n} completions of one prompt")
    if any(len(text) > 256 for text in (*data.problem_ids, *data.task_types)):
        raise GroupFileError("a problem id or task type over 256 characters")
    if len(data.stage_proofs) != len(data.members) or not 0 <= data.stage < len(data.members):
        raise GroupFileError(f"stage {data.stage} of {len(data.members)} members with "
                             f"{len(data.stage_proofs)} stages of proofs")  # fmt: skip
    if any(len(o) != len(lp) or not 1 <= len(o) <= data.max_new_tokens
           for o, lp in zip(data.outputs, data.logprobs, strict=True)):  # fmt: skip
        raise GroupFileError(f"an output of no tokens, over max_new_tokens ({data.max_new_tokens}), or "
                             "with a logprob count that differs")  # fmt: skip
    try:
        data.bundle()
    except ValueError:
        raise GroupFileError("a proof that is not hex") from None
    if data.links and [e.sender for e in data.links] != list(range(len(data.members) - 1)):
        raise GroupFileError(f"link records of senders {[e.sender for e in data.links][:8]} for "
                             f"{len(data.members)} members")  # fmt: skip
    try:
        data.frames()
    except ValueError:
        raise GroupFileError("a frame that is not base64") from None
    if data.version >= 4 and data.receipt is None:
        raise GroupFileError(f"{data.format} carries a receipt, this file none")
    return data


def plan_group_batch(task_id: str, group_id: str, members: list[str], batch: int, dataset_size: int,
                     batch_size: int, n: int = 1, target_lengths: list[int] | None = None) -> BatchPlan:
    """Batch `batch` (from 1) of a group: `batch_size` dataset rows, `n` sampling seeds for each (rows
    prompt-major) and a target length per prompt, derived from the task, the group and its members in
    stage order, so every member and every validator gets the same."""
    if batch < 1 or dataset_size < 1 or batch_size < 1 or n < 1:
        raise ValueError("batch, dataset_size, batch_size and n must be positive")
    text = "|".join([task_id, group_id, ",".join(m.lower() for m in members), str(batch)])
    digest = hashlib.sha256(text.encode()).digest()
    rng = np.random.default_rng(list(np.frombuffer(digest, dtype=np.uint32)))
    indexes = rng.integers(0, dataset_size, batch_size)
    seeds = rng.integers(0, SEED_HIGH, batch_size * n, dtype=np.int64)
    targets = rng.choice(np.asarray(target_lengths or [0], dtype=np.int64), batch_size)
    return BatchPlan(indexes=[int(i) for i in indexes], seeds=[int(s) for s in seeds],
                     target_lengths=[int(t) for t in targets], n=n)  # fmt: skip


def driver_problems(*, task_id: str, group_id: str, members: list[str], batch: int, batches: int,
                    batch_size: int, n: int, target_lengths: list[int], max_new_tokens: int,
                    temperature: float, bundle: GroupBundle, prompt_of: Callable[[int], list[int]],
                    dataset_size: int) -> list[str]:  # fmt: skip
    """What stage 0 alone decides about a batch and the task's rules say it must be: its number, its
    rows, their prompts and seeds (derived from task, group, members and number), their lengths, the
    temperature. Members check it before writing their file (a driver breaking it stops the group there);
    the validator checks it too, and a failure here is the driver's (stage 0), never another member's."""
    problems = []
    if not 1 <= batch <= batches or len(bundle.prompts) != batch_size * n:
        problems.append(f"bounds: batch {batch} of {len(bundle.prompts)} rows (the task: {batches} "
                        f"batches of {batch_size} prompts × {n})")  # fmt: skip
    if bundle.temperature != temperature:
        problems.append(f"bounds: temperature {bundle.temperature!r}, the task's is {temperature!r}")
    if any(not 1 <= len(o) <= max_new_tokens for o in bundle.outputs):
        problems.append(f"bounds: an output of no tokens or over max_new_tokens ({max_new_tokens})")
    if not problems:
        plan = plan_group_batch(task_id, group_id, members, batch, dataset_size, batch_size, n,
                                target_lengths)
        prompts = [prompt_of(i) for i in plan.indexes for _ in range(n)]
        if bundle.seeds != plan.seeds or [list(p) for p in bundle.prompts] != prompts:
            problems.append("plan: the prompts or seeds are not those (task, group, members, batch) derive")
    return problems


def policy_problems(policy: Policy, async_level: int) -> list[str]:
    """What every member checks of the driver's policy before writing its file (and a validator after):
    the checkpoint is one the step's async window allows. (Whether the step was the trainer's at the
    time only the driver could know: a validator blames that on stage 0 alone.)"""
    step, checkpoint = policy.step, policy.checkpoint_step
    if not step - async_level <= checkpoint <= step:
        return [f"freshness: checkpoint of step {checkpoint} is outside [{step - async_level}, {step}] "
                f"(async level {async_level})"]  # fmt: skip
    return []


def row_keys(data: GroupFile) -> list[str]:
    """What the validator remembers per row so a stage of a row is paid once: the row's seed and tokens
    and the stage (the same row at another stage is another member's share)."""
    return [hashlib.sha256(f"pipeline|{data.stage}|{seed}|{','.join(map(str, out))}".encode()).hexdigest()
            for seed, out in zip(data.seeds, data.outputs, strict=True)]  # fmt: skip


def shape_problems(shape: dict, *, task_id: str, group_id: str, batches: int, batch_size: int, n: int,
                   target_lengths: list[int], max_new_tokens: int, temperature: float, async_level: int,
                   prompt_of: Callable[[int], list[int]], dataset_size: int) -> list[str]:  # fmt: skip
    """A batch's step-0 shape (`inbound.step0_shape`) against the task, before a follower runs it: the
    driver's rules (`driver_problems`) on the rows it states, its limit, and its policy's window."""
    rows = len(shape["prompts"])
    stated = GroupBundle(list(shape["members"]), [list(p) for p in shape["prompts"]], [[0]] * rows,
                         [[0.0]] * rows, list(shape["seeds"]), float(shape["temperature"]), [])  # fmt: skip
    problems = driver_problems(task_id=task_id, group_id=group_id, members=stated.members,
                               batch=int(shape["batch"]), batches=batches, batch_size=batch_size, n=n,
                               target_lengths=target_lengths, max_new_tokens=max_new_tokens,
                               temperature=temperature, bundle=stated, prompt_of=prompt_of,
                               dataset_size=dataset_size)  # fmt: skip
    if shape["max_new_tokens"] != max_new_tokens:
        problems.append(f"bounds: max_new_tokens {shape['max_new_tokens']}, the task's is {max_new_tokens}")
    try:
        problems += policy_problems(Policy.from_header(shape["policy"]), async_level)
    except ValueError as exc:
        problems.append(f"policy: {exc}")
    return problems
