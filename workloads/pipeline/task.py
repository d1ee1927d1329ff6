"""`python -m workloads.pipeline.task`: one member of a pipeline group, run by a worker as its task.

The `pipeline` plug-in renders the task so that every member gets, as `INTELLECT_PIPELINE_*`
variables, the group's place from the orchestrator (`${GROUP_INDEX}`, `${GROUP_SIZE}`, `${GROUP_ID}`,
`${NEXT_P2P_ADDRESS}`), its own transport secret and every member's public key (`${MEMBER_SECRET}`,
`${GROUP_KEYS}`: no member can speak on another's link), its own inbox port (`${WORKER_P2P_PORT}`)
and node address, and the workload's settings. Each member loads only its stage, joins the ring,
and for every batch writes the group's bundle into its own file (`files.py`) and announces it to
its worker, which uploads it and submits it on chain for the member's share of the work.

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
from pathlib import Path
from typing import TYPE_CHECKING, cast

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from intellect.settings import IntellectSettings
from intellect.wire.receipts import NODE_ADDRESS
from workloads.pipeline.draft import check_draft, make_draft, trip_guesses
from workloads.pipeline.member import BatchRequest, Member, Policy
from workloads.pipeline.options import CHEATS, ENV_PREFIX, Cheat

if TYPE_CHECKING:
    from workloads.pipeline.transport import MemberKeys


class PipelineTaskSettings(IntellectSettings):
    """What a member reads from its task's environment."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    model: str = Field("tiny", description="the model split across the group ('tiny': the shipped one)")
    dataset: str = Field("reverse", description="shipped set name or a .jsonl/.parquet path")
    batch_size: int = Field(8, ge=1, le=256, description="prompts per batch (file)")
    n: int = Field(1, ge=1, le=64, description="completions per prompt (GRPO group size)")
    batches: int = Field(4, ge=1, le=100_000, description="batches the group makes, then the task ends")
    max_new_tokens: int = Field(32, ge=1, le=4096)
    temperature: float = Field(1.0, gt=0, le=10)
    target_lengths: list[int] = Field([8], min_length=1, description="target output lengths to draw from")
    length_penalty: float = Field(0.0, ge=0, description="reward -= this × |len - target|")
    # Following a trainer (an RL run), as the single-node inference workload does: the driver reads the
    # trainer's step, picks the newest checkpoint within the async level, and every member loads that
    # checkpoint's layers. Unset: step 0 and the shipped weights for every batch.
    step_url: str | None = Field(None, description="trainer step-counter URL returning {'step': int}")
    checkpoint_source: str | None = Field(None, description="as INTELLECT_INFER_CHECKPOINT_SOURCE")
    async_level: int = Field(2, ge=0, le=64)
    poll_seconds: float = Field(2.0, gt=0)
    files_per_step: int = Field(0, ge=0, description="the driver waits after this many batches of one "
                                "trainer step until the step moves (0: no cap)")
    step_patience_seconds: float = Field(20.0, gt=0, description="…but no longer than this, then one more "
                                         "batch (must stay below timeout_seconds: the members wait too)")
    checkpoint_cache: Path = Path(".checkpoints")
    timeout_seconds: float = Field(60.0, gt=0, description="how long a peer may stay silent")
    draft: str = Field("none", description="stage 0: the draft whose guesses the group checks a trip at a "
                       "time (none, prompt-lookup, model:<name or folder>); the files are those of plain "
                       "decoding")
    draft_tokens: int = Field(4, ge=0, le=15, description="stage 0: tokens guessed a trip")
    in_flight: int = Field(1, ge=1, le=64, description="batches the driver keeps moving at once: over slow "
                           "links the members work on one while another's frames cross the wire")
    cheat: str = Field("none", description="demos and tests only: the cheat of the member at cheat_stage")
    cheat_stage: int = Field(-1, ge=-1, description="the stage that cheats (-1: whichever this member "
                             "holds: the demo's cheating operator sets the cheat on its own worker)")

    # Filled by the worker from the task's template variables (runtime-owned, never the trainer's).
    group_id: str = ""
    group_index: int = Field(0, ge=0)
    group_size: int = Field(1, ge=1, le=64)
    member_secret: str = Field("", repr=False)  # this member's own transport secret (hex)
    group_keys: str = ""  # every member's transport public key (hex), comma-separated, in stage order
    # every member's node address, comma-separated, stage order (${GROUP_MEMBERS}: the orchestrator's word;
    # unset from an orchestrator that names none: the hello round alone says who is who)
    group_members: str = ""
    next_address: str = ""
    # How the two links open (${P2P_INBOX}, ${P2P_OUTBOX}): "listen" on this worker's port (the inbox on
    # P2P_PORT, the outbox on P2P_PORT + 1 for a next member behind NAT), or an address to dial.
    # Unset (an orchestrator that predates NAT groups): the inbox listens, the outbox dials next_address.
    inbox: str = "listen"
    outbox: str = ""
    p2p_port: int = Field(0, ge=0, le=65535)
    node_address: str = ""
    task_id: str = ""
    output_dir: Path = Path("pipeline")

    @model_validator(mode="after")
    def _check(self) -> PipelineTaskSettings:
        check_draft(self.draft)
        if self.cheat not in CHEATS:
            raise ValueError(f"cheat {self.cheat!r}: one of {', '.join(CHEATS)}")
        if not self.group_index < self.group_size:
            raise ValueError(f"group_index {self.group_index} is not in a group of {self.group_size}")
        if self.files_per_step and self.step_patience_seconds >= self.timeout_seconds:
            raise ValueError(f"step_patience_seconds {self.step_patience_seconds} must stay below "
                             f"timeout_seconds {self.timeout_seconds} (the members wait for the driver)")
        data_dir = os.environ.get("INTELLECT_DATA_DIR")
        if data_dir and not self.output_dir.is_absolute():
            self.output_dir = Path(data_dir) / self.output_dir
        if data_dir and not self.checkpoint_cache.is_absolute():
            self.checkpoint_cache = Path(data_dir) / self.checkpoint_cache
        return self


def _tcp(address: str) -> str:
    return address if "://" in address else f"tcp://{address}"


def file_name(batch: int, stage: int) -> str:
    return f"pipeline-batch{batch:06d}-stage{stage}.json"


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


def run(s: PipelineTaskSettings) -> int:
    import torch

    from workloads.datasets import load_dataset
    from workloads.inference.generate import completion_text
    from workloads.model.loading import load_tokenizer
    from workloads.pipeline.commit import signer_from_env
    from workloads.pipeline.files import (
        driver_problems,
        plan_group_batch,
        policy_problems,
        score_rows,
        shape_problems,
        write_group_file,
    )
    from workloads.pipeline.member import perturb_stage
    from workloads.pipeline.policy import Policies, PolicyUnavailable
    from workloads.pipeline.selfcheck import limits_for
    from workloads.pipeline.stages import load_stage, plan_stages
    from workloads.pipeline.transport import MemberError, MemberLink, MemberMisbehaved

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // max(2, s.group_size)))
    outbox = s.outbox or s.next_address
    if s.group_size > 1 and not (s.member_secret and s.group_keys and outbox and s.p2p_port):
        print("error: a group member needs INTELLECT_PIPELINE_MEMBER_SECRET, _GROUP_KEYS, _NEXT_ADDRESS and "
              "_P2P_PORT (the task's ${MEMBER_SECRET}, ${GROUP_KEYS}, ${NEXT_P2P_ADDRESS}, "
              "${WORKER_P2P_PORT})", file=sys.stderr)  # fmt: skip
        return 2
    try:
        keys = transport_keys(s)
    except ValueError as exc:
        print(f"error: the group's transport keys: {exc}", file=sys.stderr)
        return 2
    plans = plan_stages(s.model, s.group_size)
    plan, total_layers = plans[s.group_index], plans[-1].layers.stop
    policies = Policies(s)
    stage = load_stage(s.model, plan)
    try:
        draft = make_draft(s.draft) if plan.first else None  # only the driver guesses
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tok = load_tokenizer(s.model)
    records = load_dataset(s.dataset)  # every member checks the driver's plan (at step 0, before writing)
    link = None
    if keys is not None:
        listen_in, listen_out = s.inbox == "listen", outbox == "listen"
        link = MemberLink(s.group_index, keys,
                          f"tcp://0.0.0.0:{s.p2p_port}" if listen_in else None,
                          None if listen_out else _tcp(outbox), max_frame_bytes=64 << 20,
                          timeout=s.timeout_seconds, inbox_dial=None if listen_in else _tcp(s.inbox),
                          outbox_bind=f"tcp://0.0.0.0:{s.p2p_port + 1}" if listen_out else None)  # fmt: skip
        link.connect()
    cheat = s.cheat if s.cheat_stage in (-1, s.group_index) else "none"
    member = Member(stage, link, int(tok.eos_token_id), int(tok.pad_token_id), cheat=cast(Cheat, cheat),
                    address=s.node_address, on_policy=lambda p: policies.stage(plan, p),
                    signer=signer_from_env(), task_id=s.task_id, group_id=s.group_id,
                    draft=draft, draft_tokens=trip_guesses(s.draft, s.draft_tokens),
                    self_limits=limits_for(s.model), expected=[m for m in s.group_members.split(",") if m],
                    admit=lambda shape: shape_problems(
                        shape, task_id=s.task_id, group_id=s.group_id, batches=s.batches,
                        batch_size=s.batch_size, n=s.n, target_lengths=s.target_lengths,
                        max_new_tokens=s.max_new_tokens, temperature=s.temperature, async_level=s.async_level,
                        prompt_of=lambda i: list(tok(records[i].prompt)["input_ids"]),
                        dataset_size=len(records)))  # fmt: skip
    member.policy = Policy(0, 0, policies.base_sha256)  # what `load_stage` above loaded
    s.output_dir.mkdir(parents=True, exist_ok=True)
    paced_step, paced = -1, 0  # the trainer step of the driver's last batches, and how many it made
    members: list[str] = []

    def requests() -> Iterator[BatchRequest | None]:
        """The driver's batches, each made when a slot in flight frees (its policy chosen then). Once it
        made its share for a trainer step (`files_per_step`) it waits for the step to move, at most
        `step_patience_seconds`; while batches are in flight it only looks (a None: ask again later),
        since those batches may be what the trainer is waiting for."""
        nonlocal paced_step, paced
        batch, capped_at, looked = 1, 0.0, 0.0
        while batch <= s.batches:
            if (s.output_dir / file_name(batch, s.group_index)).exists():
                batch += 1
                continue  # made before a restart: the driver goes on from the first batch it lacks
            if s.files_per_step and paced >= s.files_per_step:
                capped_at = capped_at or time.monotonic()
                left = s.step_patience_seconds - (time.monotonic() - capped_at)
                if member.busy and left > 0:
                    if time.monotonic() - looked < s.poll_seconds:
                        yield None
                        continue
                    looked = time.monotonic()
                    policy = policies.choose()
                    if policy.step <= paced_step:
                        yield None
                        continue
                else:
                    policy = policies.after(paced_step, max(0.0, left))
            else:
                policy = policies.choose()
            capped_at = 0.0
            if policy.step != paced_step:
                paced_step, paced = policy.step, 0
            paced += 1
            if policy.weights != member.policy.weights:
                member.stage = policies.stage(plan, policy)
                if cheat == "weights":
                    perturb_stage(member.stage)
            batch_plan = plan_group_batch(s.task_id, s.group_id, members, batch, len(records),
                                          s.batch_size, s.n, s.target_lengths)  # fmt: skip
            prompts = [list(tok(records[i].prompt)["input_ids"]) for i in batch_plan.indexes
                       for _ in range(s.n)]  # fmt: skip
            seeds = batch_plan.seeds
            if cheat == "wrong-plan":  # tests: a driver that picks its own seeds
                seeds = [seed + 1 for seed in seeds]
            yield BatchRequest(prompts, seeds, s.max_new_tokens, s.temperature, batch=batch, policy=policy)
            batch += 1

    try:
        members = member.introduce()
        # Followers serve until the driver closes the ring after its last batch.
        for out in member.serve(requests() if plan.first else None, in_flight=s.in_flight, close=True):
            assert out.bundle is not None
            number = out.batch
            path = s.output_dir / file_name(number, s.group_index)
            if path.exists():
                continue  # this member already holds (and announced) it
            problems = driver_problems(
                task_id=s.task_id, group_id=s.group_id, members=out.bundle.members, batch=number,
                batches=s.batches, batch_size=s.batch_size, n=s.n, target_lengths=s.target_lengths,
                max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                bundle=out.bundle, prompt_of=lambda i: list(tok(records[i].prompt)["input_ids"]),
                dataset_size=len(records),
            )  # fmt: skip
            problems += policy_problems(out.bundle.policy, s.async_level)
            # The hello round told this member the members up to itself (stage 0: all of them).
            named = out.bundle.members
            if len(named) != s.group_size or named[: len(members)] != members:
                problems.append(f"the bundle names members {named}, the hello round {members}")
            # Never write (and be judged on) a batch the driver made against the task's rules.
            if problems and cheat != "wrong-plan":
                raise MemberMisbehaved(0, "; ".join(problems))
            # A member that named itself with no node address can be paid nothing, nor stated in a receipt.
            odd = [k for k, m in enumerate(named) if not re.fullmatch(NODE_ADDRESS, m)]
            if odd:
                raise MemberMisbehaved(odd[0], f"member {odd[0]} named itself {named[odd[0]][:50]!r}, not a "
                                       "node address")  # fmt: skip
            bundle = out.bundle
            batch_plan = plan_group_batch(s.task_id, s.group_id, bundle.members, number, len(records),
                                          s.batch_size, s.n, s.target_lengths)  # fmt: skip
            texts = [completion_text(tok, o) for o in bundle.outputs]
            lengths = [len(o) for o in bundle.outputs]
            scores = score_rows(records, batch_plan, texts, lengths, s.length_penalty)
            written = write_group_file(
                path, task_id=s.task_id, group_id=s.group_id, batch=number, stage=s.group_index,
                layers=(plan.layers.start, plan.layers.stop), model=s.model, max_new_tokens=s.max_new_tokens,
                bundle=bundle, n=s.n, scores=scores, total_layers=total_layers,
                received_frames=out.received_frames, sent_frames=out.sent_frames,
            )  # fmt: skip
            _announce(path, written.work_units(total_layers))
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


if __name__ == "__main__":
    sys.exit(main())
