"""A pipeline group of real member processes on loopback: the same tokens and proofs as one node; a
member that proves one thing and sends another stops the group naming it; a member that dies mid-batch
stops the group with its index named and nothing produced. Who is blamed for each cheat at every stage
position: tests/pipeline/test_blame.py (the same protocol, members as threads)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from intellect.links import LinkShape
from tests.pipeline.tiny import tiny_batch
from workloads.inference.generate import proofs_for
from workloads.model.backends import TorchBackend
from workloads.pipeline.group import GroupRun, run_local_group, run_thread_group
from workloads.pipeline.judge.end_to_end import GroupRows, GroupVerdict, judge_group
from workloads.pipeline.member import BatchRequest
from workloads.pipeline.stages import plan_stages

pytestmark = pytest.mark.slow  # each group is 2-3 interpreters loading the model



@pytest.fixture(scope="module")
def tiny():  # noqa: ANN201
    return tiny_batch(48)


def judge(tiny, run: GroupRun, members: int) -> GroupVerdict:  # noqa: ANN001
    tok, model, req = tiny
    assert run.ok, run.errors
    rows = GroupRows(req.prompts, run.outputs[0].tokens, run.outputs[members - 1].logprobs, req.seeds,
                     [run.outputs[i].proofs for i in range(members)])  # fmt: skip
    return judge_group(model, plan_stages("tiny", members), rows, int(tok.pad_token_id))


@pytest.mark.parametrize(("members", "threads"), [(2, False), (3, True)])
def test_a_group_draws_the_tokens_and_proofs_one_node_draws(tiny, members: int, threads: bool,  # noqa: ANN001
                                                             tmp_path: Path) -> None:  # fmt: skip
    """Members as processes (2, over delayed links: a relay holds every hop 5-7 ms) and as threads of
    one process (3): the same protocol either way, and the same tokens and proofs whatever the links."""
    tok, model, req = tiny
    one = TorchBackend(model, int(tok.eos_token_id), int(tok.pad_token_id)).generate(
        req.prompts, req.seeds, max_new_tokens=req.max_new_tokens, temperature=req.temperature)
    slow = LinkShape(0.005, jitter=0.002)
    run = run_thread_group(members, req) if threads else run_local_group(members, req, tmp_path, timeout=20,
                                                                         link=slow)  # fmt: skip
    assert run.ok, run.errors
    assert run.outputs[0].tokens == run.outputs[members - 1].tokens == [c.tokens for c in one]
    assert run.outputs[members - 1].proofs == proofs_for(one)  # the last stage proves what one node proves
    assert judge(tiny, run, members).accepted
    hidden = model.config.hidden_size
    # between stages: the prompt once, then one bf16 vector per row per token
    per_token = run.outputs[0].bytes_sent / sum(len(t) for t in run.outputs[0].tokens)
    assert 2 * hidden <= per_token < 2 * hidden * 8, per_token


@pytest.mark.parametrize(("members", "stage"), [(2, 0), (3, 0), (3, 1)])
def test_proving_one_thing_and_sending_another_stops_the_group_naming_the_sender(
    tiny, members: int, stage: int, tmp_path: Path  # noqa: ANN001
) -> None:
    run = run_thread_group(members, tiny[2], cheats={stage: "noise-unproven"}, timeout=3)
    receiver = run.errors[stage + 1]
    assert receiver["member"] == stage
    assert "its proofs are not those of the activations it sent" in receiver["error"]
    assert stage + 1 not in run.outputs  # nothing made of it


def test_a_member_killed_mid_batch_stops_the_group_and_is_named(tiny, tmp_path: Path) -> None:  # noqa: ANN001
    req = BatchRequest(tiny[2].prompts, tiny[2].seeds, 400, 1.0)

    def kill_member_1() -> None:
        log = tmp_path / "member-1.log"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (tmp_path / "member-0.log").exists():
            time.sleep(0.1)
        time.sleep(6)  # loaded and decoding
        for pid in _pids_with(f"--out {tmp_path / 'member-1.json'}"):
            os.kill(pid, signal.SIGKILL)
        log.touch()

    killer = threading.Thread(target=kill_member_1)
    killer.start()
    run = run_local_group(3, req, tmp_path, timeout=5)
    killer.join()
    assert not run.outputs, "a batch a member died in must produce nothing"
    assert run.errors[1]["member"] == 1  # killed: no output file
    assert run.errors[2]["member"] == 1 and "sent nothing" in run.errors[2]["error"]


def _pids_with(fragment: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if fragment in cmdline:
                found.append(int(entry.name))
    return found
