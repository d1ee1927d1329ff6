"""Blame inside a group lands on the guilty member only (issue 36): members that forward something their
layers did not make (and prove what they forward), at every stage of 2- and 3-member groups; members
that dispute what they received; files that contradict their own member's signatures; groups whose
links nobody signed. Each member is judged as the validator judges it: on its own evidence, its stage
replayed from the frames it received (`workloads/pipeline/judge/replay.py`).

Groups run as threads of this process over real CURVE links on loopback (`run_thread_group`), each
member with its own node key, so a case costs about half a second."""

from __future__ import annotations

import pytest
import torch

from tests.pipeline.tiny import tiny_batch
from workloads.pipeline.commit import LinkRecord
from workloads.pipeline.group import GroupRun, run_thread_group
from workloads.pipeline.judge.end_to_end import GroupRows, judge_group
from workloads.pipeline.judge.replay import MemberVerdict, judge_member
from workloads.pipeline.stages import plan_stages
from workloads.toploc import build_proofs_batch, verify_proofs_batch

FORWARDER_CHEATS = ["sign-flip", "negate", "small-flip", "noise", "other-prompt", "skip"]

pytestmark = pytest.mark.slow  # ~25 s of groups and replays: the full suite, not the fast tier


@pytest.fixture(scope="module")
def tiny():  # noqa: ANN201
    return tiny_batch(24)


def judge_all(tiny, run: GroupRun, members: int) -> list[MemberVerdict]:  # noqa: ANN001
    tok, model, _ = tiny
    assert run.ok, run.errors
    plans = plan_stages("tiny", members)
    return [judge_member(model, plans, k, run.outputs[k].bundle, run.outputs[k].received_frames,
                         run.outputs[k].sent_frames, task_id="local", group_id="local", batch=1,
                         eos=int(tok.eos_token_id), pad=int(tok.pad_token_id))
            for k in range(members)]  # fmt: skip


def end_to_end(tiny, run: GroupRun, members: int):  # noqa: ANN001, ANN201
    tok, model, _ = tiny
    b = run.outputs[0].bundle
    rows = GroupRows(b.prompts, b.outputs, b.logprobs, b.seeds, b.stage_proofs, b.temperature)
    return judge_group(model, plan_stages("tiny", members), rows, int(tok.pad_token_id))


def test_honest_groups_blame_nobody_and_every_link_is_signed_by_both_ends(tiny) -> None:  # noqa: ANN001
    for members in (2, 3):
        run = run_thread_group(members, tiny[2])
        verdicts = judge_all(tiny, run, members)
        assert all(v.proven and not v.guilty for v in verdicts), [v.reasons for v in verdicts]
        bundle = run.outputs[0].bundle
        assert [r.sender for r in bundle.links] == list(range(members - 1))
        assert all(r.problem("local", "local", 1, run.addresses) is None for r in bundle.links)
        assert end_to_end(tiny, run, members).accepted


FORWARDERS = [(2, 0), (3, 0), (3, 1)]  # every stage before the last, in 2- and 3-member groups


@pytest.mark.parametrize("cheat", FORWARDER_CHEATS)
@pytest.mark.parametrize(("members", "stage"), FORWARDERS)
def test_a_forwarder_is_blamed_and_no_honest_member_is(tiny, members: int, stage: int, cheat: str) -> None:  # noqa: ANN001
    """It proves what it forwards (the receiver's check of its proofs passes); `small-flip` changes only
    values no TOPLOC proof ever covers. The stage after it, fed the changed activations, is judged on
    what it received: clean."""
    run = run_thread_group(members, tiny[2], cheats={stage: cheat})
    verdicts = judge_all(tiny, run, members)
    guilty = [k for k, v in enumerate(verdicts) if v.guilty]
    assert guilty == [stage], [v.reasons for v in verdicts]
    assert all(v.proven for v in verdicts)
    assert not end_to_end(tiny, run, members).accepted  # and the batch is not paid


def test_the_attack_blamed_the_honest_successor_when_replayed_from_the_honest_input(tiny) -> None:  # noqa: ANN001
    """Why blame must be local: the end-to-end replay (every stage from the recomputed honest input)
    finds the forwarder's proofs clean and its successor off."""
    run = run_thread_group(2, tiny[2], cheats={0: "small-flip"})
    assert end_to_end(tiny, run, 2).blamed == 1
    assert [v.guilty for v in judge_all(tiny, run, 2)] == [True, False]


@pytest.mark.parametrize(("members", "stage", "cheat"), [(2, 1, "forge-token"), (3, 2, "forge-token"),
                                                         (2, 1, "skip"), (3, 2, "skip")])  # fmt: skip
def test_the_last_stage_is_blamed_on_its_proofs_or_its_sampling_of_what_it_received(
    tiny, members: int, stage: int, cheat: str  # noqa: ANN001
) -> None:
    verdicts = judge_all(tiny, run_thread_group(members, tiny[2], cheats={stage: cheat}), members)
    assert [k for k, v in enumerate(verdicts) if v.guilty] == [stage], [v.reasons for v in verdicts]


@pytest.mark.parametrize(("members", "receiver"), [(2, 1), (3, 1), (3, 2)])
def test_a_receiver_that_falsely_says_the_seal_does_not_match_stops_the_batch_and_costs_nobody_stake(
    tiny, members: int, receiver: int  # noqa: ANN001
) -> None:
    """Live, a dispute drops the batch (no file is written, so nothing is judged or paid); the
    accusation names the sender only in the receiver's own log."""
    run = run_thread_group(members, tiny[2], cheats={receiver: "false-accuse"}, timeout=2.0)
    assert not run.outputs  # nobody holds a file of the batch
    assert run.errors[receiver]["member"] == receiver - 1 and "seal" in run.errors[receiver]["error"]


@pytest.mark.parametrize(("members", "receiver"), [(2, 1), (3, 1), (3, 2)])
def test_a_receiver_that_countersigns_other_bytes_makes_a_dispute_that_blames_nobody(
    tiny, members: int, receiver: int  # noqa: ANN001
) -> None:
    run = run_thread_group(members, tiny[2], cheats={receiver: "forge-received"})
    verdicts = judge_all(tiny, run, members)
    assert not any(v.guilty for v in verdicts), [v.reasons for v in verdicts]
    for k in (receiver - 1, receiver):  # the two ends of the disputed link: no proof either way
        assert not verdicts[k].proven and "disagree" in verdicts[k].reasons[0]
    others = [k for k in range(members) if k not in (receiver - 1, receiver)]
    assert all(verdicts[k].proven for k in others)


def test_a_file_whose_frames_are_not_what_its_member_signed_is_its_own_fault(tiny) -> None:  # noqa: ANN001
    """A member that rewrites, in its own file, what it received (to make a bad output look as if it
    followed) contradicts its own countersignature; its neighbours' files are untouched."""
    tok, model, _ = tiny
    run = run_thread_group(3, tiny[2])
    out = run.outputs[1]
    received = [list(parts) for parts in out.received_frames]
    received[0] = [received[0][0], bytes(len(received[0][1]))]  # step 0's activations zeroed
    plans = plan_stages("tiny", 3)
    got = judge_member(model, plans, 1, out.bundle, received, out.sent_frames, task_id="local",
                       group_id="local", batch=1, eos=int(tok.eos_token_id),
                       pad=int(tok.pad_token_id))  # fmt: skip
    assert got.guilty and "not those it countersigned" in got.reasons[0]


def test_a_group_whose_links_nobody_signed_can_blame_nobody(tiny) -> None:  # noqa: ANN001
    run = run_thread_group(2, tiny[2], cheats={0: "negate"}, signed=False)
    verdicts = judge_all(tiny, run, 2)
    assert not any(v.guilty for v in verdicts) and not any(v.proven for v in verdicts)


def test_a_record_signed_by_another_key_or_for_another_batch_proves_nothing(tiny) -> None:  # noqa: ANN001
    run = run_thread_group(2, tiny[2])
    bundle = run.outputs[1].bundle
    record = bundle.links[0]
    swapped = LinkRecord(0, record.sha256, record.countersignature, record.received_sha256, record.signature)
    assert "not signed by" in (swapped.problem("local", "local", 1, run.addresses) or "")
    assert "not signed by" in (record.problem("local", "local", 2, run.addresses) or "")  # another batch


def test_the_pipeline_proof_comparison_covers_the_sign() -> None:
    hidden = torch.randn(40, 128).to(torch.bfloat16)
    proofs = build_proofs_batch([hidden])
    assert verify_proofs_batch([-hidden], proofs)[0].passed  # TOPLOC as the reference: the sign is free
    assert not verify_proofs_batch([-hidden], proofs, signed=True)[0].passed
    assert verify_proofs_batch([hidden], proofs, signed=True)[0].passed
