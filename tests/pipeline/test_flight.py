"""Batches in flight (`workloads/pipeline/flight.py`): a group that keeps several batches moving makes,
byte for byte, what it makes running them one at a time (tokens, logprobs, proofs, the frames its seals
commit to, the signed link records), whatever order they end in; a predecessor cannot reopen a batch
or open more than a member keeps; the driver's close ends its followers."""

from __future__ import annotations

import pytest
import torch

from intellect.identity import Wallet
from intellect.net import stable_port
from workloads.model.loading import load_tokenizer
from workloads.pipeline.bundle import Policy, StageOutput
from workloads.pipeline.flight import MAX_IN_FLIGHT, Closed, Flight, InFlight, Steps, Want
from workloads.pipeline.group import run_thread_group
from workloads.pipeline.member import BatchRequest
from workloads.pipeline.stages import load_stage, plan_stages
from workloads.pipeline.transport import MemberLink, MemberMisbehaved, local_keys

WORDS = ["abc", "hello", "pipeline", "stage", "group", "verify", "token", "proof", "ring", "flight"]


def _requests() -> list[BatchRequest]:
    """Five batches of other sizes and lengths: the short ones end before the long ones started earlier."""
    tok = load_tokenizer("tiny")
    shapes = [(4, 24), (2, 3), (3, 12), (1, 6), (4, 9)]  # (rows, max_new_tokens)
    out = []
    for b, (rows, limit) in enumerate(shapes, start=1):
        prompts = [tok(f"reverse: {WORDS[(b + r) % len(WORDS)]}")["input_ids"] for r in range(rows)]
        out.append(BatchRequest(prompts, [1000 * b + r for r in range(rows)], limit, 1.0, batch=b))
    return out


def _made(out: StageOutput) -> dict:
    """Everything a member's file is made of (not its timings)."""
    assert out.bundle is not None
    return {"batch": out.batch, "proofs": out.proofs, "tokens": out.tokens, "logprobs": out.logprobs,
            "bundle": out.bundle.header(), "received": out.received_frames,
            "sent": out.sent_frames}  # fmt: skip


@pytest.mark.parametrize("members", [2, 3])
def test_batches_in_flight_make_byte_for_byte_what_batches_one_at_a_time_make(members: int) -> None:
    requests = _requests()
    keys = [Wallet.create() for _ in range(members)]  # the same keys: the same (RFC 6979) signatures
    alone = run_thread_group(members, requests, keys=keys, in_flight=1)
    flying = run_thread_group(members, requests, keys=keys, in_flight=4)
    assert alone.ok and flying.ok, (alone.errors, flying.errors)
    assert len(alone.batches) == len(flying.batches) == len(requests)
    for b, request in enumerate(requests):
        for i in range(members):
            assert _made(flying.batches[b][i]) == _made(alone.batches[b][i]), (b, i)
        bundle = flying.batches[b][0].bundle
        assert bundle is not None and len(bundle.links) == members - 1
        assert all(r.signature and r.countersignature for r in bundle.links)
        assert bundle.seeds == request.seeds and max(map(len, bundle.outputs)) <= request.max_new_tokens
    # they were in flight together: batch 2 (3 tokens) ended at the driver before batch 1 (24 tokens)
    first, second = flying.batches[0][0], flying.batches[1][0]
    assert second.started < first.started + first.seconds
    assert second.started + second.seconds < first.started + first.seconds


def _follower_link() -> tuple[MemberLink, MemberLink]:
    keys, ports = local_keys(2), [stable_port(), stable_port()]
    links = [MemberLink(i, keys[i], f"tcp://127.0.0.1:{ports[i]}", f"tcp://127.0.0.1:{ports[1 - i]}",
                        max_frame_bytes=1 << 16, timeout=2.0) for i in range(2)]  # fmt: skip
    for link in links:
        link.connect()
    return links[0], links[1]


def test_a_follower_refuses_a_reopened_batch_and_more_batches_than_it_keeps_and_ends_at_close() -> None:
    stage = load_stage("tiny", plan_stages("tiny", 2)[1])
    driver, follower = _follower_link()
    opened: list[int] = []

    def open_batch(route: int) -> tuple[InFlight, Steps]:
        def steps() -> Steps:
            while True:  # a batch that waits for frames and never ends
                yield Want("act")

        opened.append(route)
        return InFlight(route, stage, Policy()), steps()

    try:
        flight = Flight(follower)
        driver.send({"kind": "act", "step": 0}, torch.zeros(1, 1, 4), route=5)
        assert flight.deliver(open_batch) is None and opened == [5]
        driver.send({"kind": "act", "step": 1}, torch.zeros(1, 1, 4), route=5)
        assert flight.deliver(open_batch) is None and opened == [5]  # the same batch, not a new one
        assert len(flight.waiting[5][0].received.frames) == 2  # kept in that batch's own log
        driver.send({"kind": "act", "step": 0}, route=3)  # older than a batch it opened
        with pytest.raises(MemberMisbehaved, match="batch route 3, which is not in flight"):
            flight.deliver(open_batch)
        for route in range(6, 6 + MAX_IN_FLIGHT):
            driver.send({"kind": "act", "step": 0}, route=route)
        with pytest.raises(MemberMisbehaved, match=f"over {MAX_IN_FLIGHT} batches open at once"):
            for _ in range(MAX_IN_FLIGHT):
                flight.deliver(open_batch)
        assert len(flight.waiting) == MAX_IN_FLIGHT and opened[-1] == 5 + MAX_IN_FLIGHT - 1
        driver.send({"kind": "tok", "step": 0}, route=5)  # a batch's frame of a kind it does not wait for
        with pytest.raises(MemberMisbehaved, match="expected a 'act' frame"):
            flight.deliver(open_batch)
        driver.send({"kind": "close"})
        with pytest.raises(Closed):
            flight.deliver(open_batch)
        driver.send({"kind": "end"})  # the ring's route carries hello and close only
        with pytest.raises(MemberMisbehaved, match="an end frame outside any batch"):
            flight.deliver(open_batch)
    finally:
        driver.close()
        follower.close()
