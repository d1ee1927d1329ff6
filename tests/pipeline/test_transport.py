"""The group's links: only the predecessor's key may connect, frames are bounded, a silent peer is
named, a malformed frame is refused."""

from __future__ import annotations

import secrets

import pytest
import torch
import zmq

from intellect.net import stable_port
from workloads.pipeline.transport import (
    RING,
    ROUTE_BYTES,
    MemberLink,
    MemberMisbehaved,
    MemberTimeout,
    member_keys,
)

ROUTE = RING.to_bytes(ROUTE_BYTES, "big")  # frames outside any batch travel on route 0


def ring(members: int, secret: bytes, max_frame_bytes: int = 1 << 20) -> list[MemberLink]:
    ports = [stable_port() for _ in range(members)]
    links = [MemberLink(i, members, secret, f"tcp://127.0.0.1:{ports[i]}",
                        f"tcp://127.0.0.1:{ports[(i + 1) % members]}", max_frame_bytes=max_frame_bytes,
                        timeout=2.0) for i in range(members)]  # fmt: skip
    for link in links:
        link.connect()
    return links


def test_activations_cross_the_ring_intact() -> None:
    links = ring(3, secrets.token_bytes(32))
    try:
        sent = torch.randn(2, 5, 16).to(torch.bfloat16)
        links[0].send({"kind": "act", "step": 0}, sent)
        frame = links[1].recv("act")
        assert frame.header["step"] == 0 and frame.tensor is not None and torch.equal(frame.tensor, sent)
        links[2].send({"kind": "tok", "tokens": [1, 2]})
        assert links[0].recv("tok").header["tokens"] == [1, 2]  # the last member reaches the first
    finally:
        for link in links:
            link.close()


def test_a_stranger_and_a_member_out_of_turn_cannot_feed_an_inbox() -> None:
    secret = secrets.token_bytes(32)
    links = ring(3, secret)
    context = zmq.Context()
    try:
        for who, keys in (("outsider", zmq.curve_keypair()), ("member 2", member_keys(secret, 2)[::-1])):
            public, secret_key = (keys[0], keys[1]) if who == "outsider" else (keys[1], keys[0])
            push = context.socket(zmq.PUSH)
            push.curve_publickey, push.curve_secretkey = public, secret_key
            push.curve_serverkey = member_keys(secret, 1)[0]
            push.setsockopt(zmq.LINGER, 0)
            push.connect(links[1].bound)
            push.send_multipart([ROUTE, b'{"kind": "act", "step": 0}'], copy=True)
            with pytest.raises(MemberTimeout, match="member 0: sent nothing"):
                links[1].recv("act", timeout=1.0)  # member 1 hears only member 0
            push.close()
    finally:
        context.term()
        for link in links:
            link.close()


def test_an_oversized_frame_never_arrives_and_a_malformed_one_is_refused() -> None:
    links = ring(2, secrets.token_bytes(32), max_frame_bytes=1024)
    try:
        links[0].send({"kind": "act", "step": 0}, torch.zeros(64 * 1024, dtype=torch.bfloat16))
        with pytest.raises(MemberTimeout):
            links[1].recv("act", timeout=1.0)  # dropped by the inbox's MAXMSGSIZE
        links[0].outbox.send_multipart([b"not json"])
        with pytest.raises(MemberMisbehaved, match="a frame without its route"):
            links[1].recv("act")
        links[0].outbox.send_multipart([ROUTE, b"not json"])
        with pytest.raises(MemberMisbehaved, match="not JSON"):
            links[1].recv("act")
        links[0].send({"kind": "tok", "step": 0})
        with pytest.raises(MemberMisbehaved, match="expected a 'act' frame"):
            links[1].recv("act")
        links[0].outbox.send_multipart([ROUTE, b'{"kind": "act", "shape": [4], "dtype": "bfloat16"}', b"123"])
        with pytest.raises(MemberMisbehaved, match="3 bytes for a torch.bfloat16 tensor"):
            links[1].recv("act")
    finally:
        for link in links:
            link.close()


def test_a_member_behind_nat_opens_both_of_its_links_and_only_its_peer_hears_a_listening_outbox() -> None:
    """Member 1 cannot be called: its inbox dials member 0's listening outbox, its outbox dials member
    2 as usual. The roles stay: member 1's inbox still admits member 0's key alone, and member 0's
    listening outbox hands frames only to a peer that holds member 1's key."""
    secret, n = secrets.token_bytes(32), 3
    ports = [stable_port() for _ in range(n)]
    out0 = f"tcp://127.0.0.1:{stable_port()}"
    inbox = [f"tcp://127.0.0.1:{p}" for p in ports]
    links = [
        MemberLink(0, n, secret, inbox[0], None, outbox_bind=out0, max_frame_bytes=1 << 20, timeout=2.0),
        MemberLink(1, n, secret, None, inbox[2], inbox_dial=out0, max_frame_bytes=1 << 20, timeout=2.0),
        MemberLink(2, n, secret, inbox[2], inbox[0], max_frame_bytes=1 << 20, timeout=2.0),
    ]
    context = zmq.Context()
    stranger = context.socket(zmq.PULL)  # dials the listening outbox with keys of its own
    public, secret_key = zmq.curve_keypair()
    stranger.curve_server, stranger.curve_publickey, stranger.curve_secretkey = True, public, secret_key
    stranger.setsockopt(zmq.LINGER, 0)
    try:
        for link in links:
            link.connect()
        stranger.connect(out0)
        for step in range(4):  # PUSH would deal frames round-robin to every peer that shook hands
            sent = torch.full((1, 2, 8), float(step)).to(torch.bfloat16)
            links[0].send({"kind": "act", "step": step}, sent)
            frame = links[1].recv("act")
            assert frame.header["step"] == step and torch.equal(frame.tensor, sent)
        assert stranger.poll(500) == 0
        links[1].send({"kind": "act", "step": 9}, torch.zeros(1, 2, 8, dtype=torch.bfloat16))
        assert links[2].recv("act").header["step"] == 9
        links[2].send({"kind": "tok", "tokens": [3]})
        assert links[0].recv("tok").header["tokens"] == [3]  # round the ring
    finally:
        stranger.close()
        context.term()
        for link in links:
            link.close()


def test_a_link_opened_from_neither_end_is_refused() -> None:
    with pytest.raises(ValueError, match="either binds or dials"):
        MemberLink(0, 2, b"k" * 32, None, "tcp://127.0.0.1:1", max_frame_bytes=1024)
