"""A pipeline group whose members sit on hosts of their own (network namespaces, devnet/hosts.py), some
behind a NAT home router that lets nothing in: the member behind NAT opens both of its links (its
inbox dials its predecessor's listening outbox), so one reachable neighbour is enough; the group
draws the tokens one node draws. Without that (the plain ring) the same group cannot run: nobody can
call the member behind NAT. Needs root and nftables, as CI has."""

from __future__ import annotations

from pathlib import Path

import pytest

from devnet.hosts import World
from workloads.model.backends import TorchBackend
from workloads.model.loading import load_model, load_tokenizer
from workloads.pipeline.group import run_local_group
from workloads.pipeline.member import BatchRequest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world():  # noqa: ANN201
    w = World.create()
    try:
        w.add_host("pub1")
        w.add_host("pub2")
        w.add_home("home")
        w.add_host("gamer1", behind="home")
        yield w
    finally:
        w.destroy()


@pytest.fixture(scope="module")
def request_and_tokens():  # noqa: ANN201
    tok = load_tokenizer("tiny")
    prompts = [tok(f"reverse: {w}")["input_ids"] for w in ("nat", "home", "router", "peer")]
    req = BatchRequest(prompts, [7, 8, 9, 10], 12, 1.0)
    one = TorchBackend(load_model("tiny"), int(tok.eos_token_id), int(tok.pad_token_id)).generate(
        req.prompts, req.seeds, max_new_tokens=req.max_new_tokens, temperature=req.temperature)
    return req, [c.tokens for c in one]


@pytest.mark.parametrize(("placed", "nat"), [
    (("pub1", "gamer1"), {1}),  # the last stage behind NAT
    (("gamer1", "pub1"), {0}),  # the driver behind NAT
    (("pub1", "gamer1", "pub2"), {1}),  # three stages, the middle one behind NAT
])  # fmt: skip
def test_a_member_behind_nat_runs_next_to_a_reachable_one(world: World, request_and_tokens, placed, nat,
                                                          tmp_path: Path) -> None:  # fmt: skip
    req, expected = request_and_tokens
    hosts = [world.hosts[name] for name in placed]
    assert {i for i, h in enumerate(hosts) if h.home} == nat  # the test places them as it says
    run = run_local_group(len(hosts), req, tmp_path, hosts=hosts, behind_nat=nat, timeout=20)
    assert run.ok, run.errors
    assert run.outputs[0].tokens == expected and run.outputs[len(hosts) - 1].tokens == expected


def test_the_plain_ring_cannot_reach_a_member_behind_nat(world: World, request_and_tokens,
                                                         tmp_path: Path) -> None:  # fmt: skip
    req, _ = request_and_tokens
    hosts = [world.hosts["pub1"], world.hosts["gamer1"]]
    run = run_local_group(2, req, tmp_path, hosts=hosts, behind_nat=set(), timeout=6)
    assert not run.ok
    # the driver's activations never reach member 1's inbox: both sides time out on a silent peer
    assert run.errors and all("sent nothing" in e["error"] or "did not take" in e["error"]
                              for e in run.errors.values()), run.errors  # fmt: skip
