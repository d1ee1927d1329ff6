"""`python -m workloads.pipeline task`: one member of a pipeline group, run by a worker as its task.

The `pipeline` plug-in renders the task so that every member gets, as `INTELLECT_PIPELINE_*`
variables (`settings.PipelineTaskSettings`), the group's place from the orchestrator (`${GROUP_INDEX}`,
`${GROUP_SIZE}`, `${GROUP_ID}`, `${NEXT_P2P_ADDRESS}`), its own transport secret and every member's
public key (`${MEMBER_SECRET}`, `${GROUP_KEYS}`: no member can speak on another's link), its own inbox
port (`${WORKER_P2P_PORT}`) and node address, and the workload's settings. Each member loads only its
stage, joins the ring, and for every batch writes the group's bundle into its own file (`files.py`)
and announces it to its worker, which uploads it and submits it on chain for the member's share of
the work.

A restart (a member died, the group re-formed) goes on from the first batch the driver has no file
for; a member that already holds a batch's file keeps it and does not announce it twice, so nothing
is credited twice and a half-made batch is never written (a member's file is written only once the
whole bundle came round the ring).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from intellect.wire.receipts import NODE_ADDRESS
from workloads.pipeline.draft import make_draft, trip_guesses
from workloads.pipeline.files import file_name
from workloads.pipeline.member import BatchRequest, Member, Policy, StageOutput
from workloads.pipeline.options import Cheat
from workloads.pipeline.settings import PipelineTaskSettings

if TYPE_CHECKING:
    from pathlib import Path

    from workloads.pipeline.draft import Draft
    from workloads.pipeline.policy import Policies
    from workloads.pipeline.stages import Stage, StagePlan
    from workloads.pipeline.transport import MemberKeys, MemberLink
    from workloads.verifiers import TaskRecord


def _tcp(address: str) -> str:
    return address if "://" in address else f"tcp://{address}"


def transport_keys(s: PipelineTaskSettings) -> MemberKeys | None:
    """This member's transport keys (None: a group of one has no links), checked before a model loads:
    wrong keys would otherwise show only as handshakes that never complete."""
    from workloads.pipeline.transport import MemberKeys

    if s.group_size == 1:
        return None
    keys = MemberKeys.from_hex(s.member_secret, s.group_keys)
    if len(keys.publics) != s.group_size:
        raise ValueError(f"{len(keys.publics)} public keys for a group of {s.group_size}")
    keys.check(s.group_index)
    return keys


def open_link(s: PipelineTaskSettings, keys: MemberKeys) -> MemberLink:
    """This member's two links, connected: each end listens on this worker's port or dials, as the
    orchestrator said (`${P2P_INBOX}`, `${P2P_OUTBOX}`: a member behind NAT dials both of its links)."""
    from workloads.pipeline.transport import MemberLink

    outbox = s.outbox or s.next_address
    listen_in, listen_out = s.inbox == "listen", outbox == "listen"
    link = MemberLink(s.group_index, keys,
                      f"tcp://0.0.0.0:{s.p2p_port}" if listen_in else None,
                      None if listen_out else _tcp(outbox), max_frame_bytes=64 << 20,
                      timeout=s.timeout_seconds, inbox_dial=None if listen_in else _tcp(s.inbox),
                      outbox_bind=f"tcp://0.0.0.0:{s.p2p_port + 1}" if listen_out else None)  # fmt: skip
    link.connect()
    return link


@dataclass
class MemberTask:
    """One member's part of the task once its stage is loaded and its link connected: what the driver
    asks of the group (`requests`) and what every member writes of each batch (`write`)."""

    s: PipelineTaskSettings
    plan: StagePlan
    total_layers: int
    policies: Policies
    tok: Any  # the model's tokenizer
    records: list[TaskRecord]  # the dataset: every member checks the driver's plan against it
    cheat: str
    members: list[str] = field(default_factory=list)  # what the hello round named (stage 0: all)
    paced_step: int = -1  # the trainer step of the driver's last batches...
    paced: int = 0  # ...and how many it made for it
    member: Member = field(init=False)  # made with this task's `admit` and policies (`_member`)

    def prompt_of(self, index: int) -> list[int]:
        return list(self.tok(self.records[index].prompt)["input_ids"])

    def admit(self, shape: dict[str, Any]) -> list[str]:
        """A follower's check of step 0's shape against the task's plan, before it runs the batch."""
        from workloads.pipeline.files import shape_problems

        s = self.s
        return shape_problems(
            shape, task_id=s.task_id, group_id=s.group_id, batches=s.batches, batch_size=s.batch_size,
            n=s.n, target_lengths=s.target_lengths, max_new_tokens=s.max_new_tokens,
            temperature=s.temperature, async_level=s.async_level, prompt_of=self.prompt_of,
            dataset_size=len(self.records))  # fmt: skip

    def requests(self) -> Iterator[BatchRequest | None]:
        """The driver's batches, each made when a slot in flight frees (its policy chosen then). Once it
        made its share for a trainer step (`files_per_step`) it waits for the step to move, at most
        `step_patience_seconds`; while batches are in flight it only looks (a None: ask again later),
        since those batches may be what the trainer is waiting for."""
        s = self.s
        batch, capped_at, looked = 1, 0.0, 0.0
        while batch <= s.batches:
            if (s.output_dir / file_name(batch, s.group_index)).exists():
                batch += 1
                continue  # made before a restart: the driver goes on from the first batch it lacks
            if s.files_per_step and self.paced >= s.files_per_step:
                capped_at = capped_at or time.monotonic()
                left = s.step_patience_seconds - (time.monotonic() - capped_at)
                if self.member.busy and left > 0:
                    if time.monotonic() - looked < s.poll_seconds:
                        yield None
                        continue
                    looked = time.monotonic()
                    policy = self.policies.choose()
                    if policy.step <= self.paced_step:
                        yield None
                        continue
                else:
                    policy = self.policies.after(self.paced_step, max(0.0, left))
            else:
                policy = self.policies.choose()
            capped_at = 0.0
            yield self._request(batch, policy)
            batch += 1

    def _request(self, batch: int, policy: Policy) -> BatchRequest:
        """Batch `batch` made with `policy`: counted for its trainer step, this member's layers of that
        checkpoint loaded, its prompts and seeds the group's plan."""
        from workloads.pipeline.cheats import perturb_stage
        from workloads.pipeline.files import plan_group_batch

        s = self.s
        if policy.step != self.paced_step:
            self.paced_step, self.paced = policy.step, 0
        self.paced += 1
        if policy.weights != self.member.policy.weights:
            self.member.stage = self.policies.stage(self.plan, policy)
            if self.cheat == "weights":
                perturb_stage(self.member.stage)
        batch_plan = plan_group_batch(s.task_id, s.group_id, self.members, batch, len(self.records),
                                      s.batch_size, s.n, s.target_lengths)  # fmt: skip
        prompts = [self.prompt_of(i) for i in batch_plan.indexes for _ in range(s.n)]
        seeds = batch_plan.seeds
        if self.cheat == "wrong-plan":  # tests: a driver that picks its own seeds
            seeds = [seed + 1 for seed in seeds]
        return BatchRequest(prompts, seeds, s.max_new_tokens, s.temperature, batch=batch, policy=policy)

    def check(self, out: StageOutput) -> None:
        """Never write (and be judged on) a batch the driver made against the task's rules, nor one that
        names a member with no node address (it can be paid nothing, nor stated in a receipt)."""
        from workloads.pipeline.files import driver_problems, policy_problems
        from workloads.pipeline.transport import MemberMisbehaved

        s, bundle = self.s, out.bundle
        assert bundle is not None
        problems = driver_problems(
            task_id=s.task_id, group_id=s.group_id, members=bundle.members, batch=out.batch,
            batches=s.batches, batch_size=s.batch_size, n=s.n, target_lengths=s.target_lengths,
            max_new_tokens=s.max_new_tokens, temperature=s.temperature,
            bundle=bundle, prompt_of=self.prompt_of, dataset_size=len(self.records),
        )  # fmt: skip
        problems += policy_problems(bundle.policy, s.async_level)
        # The hello round told this member the members up to itself (stage 0: all of them).
        named = bundle.members
        if len(named) != s.group_size or named[: len(self.members)] != self.members:
            problems.append(f"the bundle names members {named}, the hello round {self.members}")
        if problems and self.cheat != "wrong-plan":
            raise MemberMisbehaved(0, "; ".join(problems))
        odd = [k for k, m in enumerate(named) if not re.fullmatch(NODE_ADDRESS, m)]
        if odd:
            raise MemberMisbehaved(odd[0], f"member {odd[0]} named itself {named[odd[0]][:50]!r}, not a "
                                   "node address")  # fmt: skip

    def write(self, out: StageOutput) -> None:
        """This member's file of a batch that came round the ring, scored and announced; a batch it
        already holds (and announced) is left as it is."""
        from workloads.inference.generate import completion_text
        from workloads.pipeline.files import plan_group_batch, score_rows, write_group_file

        s, bundle = self.s, out.bundle
        assert bundle is not None
        path = s.output_dir / file_name(out.batch, s.group_index)
        if path.exists():
            return
        self.check(out)
        batch_plan = plan_group_batch(s.task_id, s.group_id, bundle.members, out.batch, len(self.records),
                                      s.batch_size, s.n, s.target_lengths)  # fmt: skip
        texts = [completion_text(self.tok, o) for o in bundle.outputs]
        scores = score_rows(self.records, batch_plan, texts, [len(o) for o in bundle.outputs],
                            s.length_penalty)  # fmt: skip
        written = write_group_file(
            path, task_id=s.task_id, group_id=s.group_id, batch=out.batch, stage=s.group_index,
            layers=(self.plan.layers.start, self.plan.layers.stop), model=s.model,
            max_new_tokens=s.max_new_tokens, bundle=bundle, n=s.n, scores=scores,
            total_layers=self.total_layers, received_frames=out.received_frames, sent_frames=out.sent_frames,
        )  # fmt: skip
        _announce(path, written.work_units(self.total_layers))


def _start_problem(s: PipelineTaskSettings) -> str | None:
    """What keeps this member from joining its group at all, said before a model loads."""
    if s.group_size > 1 and not (s.member_secret and s.group_keys and (s.outbox or s.next_address)
                                 and s.p2p_port):  # fmt: skip
        return ("a group member needs INTELLECT_PIPELINE_MEMBER_SECRET, _GROUP_KEYS, _NEXT_ADDRESS and "
                "_P2P_PORT (the task's ${MEMBER_SECRET}, ${GROUP_KEYS}, ${NEXT_P2P_ADDRESS}, "
                "${WORKER_P2P_PORT})")  # fmt: skip
    return None


def run(s: PipelineTaskSettings) -> int:
    import torch

    from workloads.datasets import load_dataset
    from workloads.model.loading import load_tokenizer
    from workloads.pipeline.policy import Policies, PolicyUnavailable
    from workloads.pipeline.stages import load_stage, plan_stages
    from workloads.pipeline.transport import MemberError

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // max(2, s.group_size)))
    problem = _start_problem(s)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        keys = transport_keys(s)
    except ValueError as exc:
        print(f"error: the group's transport keys: {exc}", file=sys.stderr)
        return 2
    plans = plan_stages(s.model, s.group_size)
    plan = plans[s.group_index]
    policies = Policies(s)
    stage = load_stage(s.model, plan)
    try:
        draft = make_draft(s.draft) if plan.first else None  # only the driver guesses
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tok = load_tokenizer(s.model)
    records = load_dataset(s.dataset)  # every member checks the driver's plan (at step 0, before writing)
    link = open_link(s, keys) if keys is not None else None
    cheat = s.cheat if s.cheat_stage in (-1, s.group_index) else "none"
    if cheat == "frame":  # a framer forwards what its layers did not make; the last stage forwards nothing,
        cheat = "noise" if s.group_index < len(plans) - 1 else "forge-token"  # it forges the tokens instead
    task = MemberTask(s, plan, plans[-1].layers.stop, policies, tok, records, cheat)
    task.member = _member(s, task, stage, link, draft)
    s.output_dir.mkdir(parents=True, exist_ok=True)
    try:
        task.members = task.member.introduce()
        # Followers serve until the driver closes the ring after its last batch.
        for out in task.member.serve(task.requests() if plan.first else None, in_flight=s.in_flight,
                                     close=True):  # fmt: skip
            task.write(out)
    except MemberError as exc:  # a peer died, stalled or misbehaved: this batch is dropped, nothing written
        print(f"error: {exc} (member {exc.member}); the batch is redone when the group runs again",
              file=sys.stderr)  # fmt: skip
        return 3
    except PolicyUnavailable as exc:  # this member cannot load the batch's checkpoint (yet)
        print(f"error: {exc}; the batch is redone when the group runs again", file=sys.stderr)
        return 3
    finally:
        if link is not None:
            link.close()
    return 0


def _member(s: PipelineTaskSettings, task: MemberTask, stage: Stage, link: MemberLink | None,
            draft: Draft | None) -> Member:  # fmt: skip
    """The member's decode loop as the task's settings make it: its node key through the worker's
    bridge, the policy's layers from `Policies`, the task's plan as what a follower admits."""
    from workloads.pipeline.commit import signer_from_env
    from workloads.pipeline.selfcheck import limits_for

    member = Member(stage, link, int(task.tok.eos_token_id), int(task.tok.pad_token_id),
                    cheat=cast(Cheat, task.cheat), address=s.node_address,
                    on_policy=lambda p: task.policies.stage(task.plan, p), signer=signer_from_env(),
                    task_id=s.task_id, group_id=s.group_id, draft=draft,
                    draft_tokens=trip_guesses(s.draft, s.draft_tokens), self_limits=limits_for(s.model),
                    expected=[m for m in s.group_members.split(",") if m], admit=task.admit)  # fmt: skip
    member.policy = Policy(0, 0, task.policies.base_sha256)  # what `load_stage` loaded
    return member


def _announce(path: Path, units: int) -> None:
    if not os.environ.get("INTELLECT_SOCKET_PATH"):
        return
    from workloads.bridge_client import announce_file

    announce_file(path, work_units=units)


def main() -> int:
    try:
        settings = PipelineTaskSettings()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return run(settings)
