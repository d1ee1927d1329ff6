"""The group's links: only the predecessor's key may connect, and only the predecessor holds its secret
(each member its own), frames are bounded, a silent peer is named, a malformed frame is refused."""

from __future__ import annotations

import pytest
import torch
import zmq

from intellect.net import stable_port
from workloads.pipeline.transport import (
    RING,
    ROUTE_BYTES,
    MemberKeys,
    MemberLink,
    MemberMisbehaved,
    MemberTimeout,
    local_keys,
)

ROUTE = RING.to_bytes(ROUTE_BYTES, "big")  # frames outside any batch travel on route 0


def ring(keys: list[MemberKeys], max_frame_bytes: int = 1 << 20) -> list[MemberLink]:
    members = len(keys)
    ports = [stable_port() for _ in range(members)]
    links = [MemberLink(i, keys[i], f"tcp://127.0.0.1:{ports[i]}",
                        f"tcp://127.0.0.1:{ports[(i + 1) % members]}", max_frame_bytes=max_frame_bytes,
                        timeout=2.0) for i in range(members)]  # fmt: skip
    for link in links:
        link.connect()
    return links


def test_activations_cross_the_ring_intact() -> None:
    links = ring(local_keys(3))
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


def _feed(inbox: str, server: bytes, public: bytes, secret: bytes, context: zmq.Context) -> zmq.Socket:
    """Connect to `inbox` (whose key is `server`) as `public` holding `secret`, and send it a frame."""
    push = context.socket(zmq.PUSH)
    push.curve_publickey, push.curve_secretkey, push.curve_serverkey = public, secret, server
    push.setsockopt(zmq.LINGER, 0)
    push.connect(inbox)
    push.send_multipart([ROUTE, b'{"kind": "act", "step": 7}'], copy=True)
    return push


def test_a_stranger_a_member_out_of_turn_or_posing_as_the_predecessor_cannot_feed_an_inbox() -> None:
    """Member 2 holds its own secret and every public key. As itself it is not member 1's predecessor; as
    member 0 (its key claimed, its own secret used) the CURVE handshake fails: only member 0's secret opens
    member 1's inbox, as the control shows. With keys all derived from one group secret, member 2 could
    work out member 0's secret and be that control."""
    keys = local_keys(3)
    links = ring(keys)
    context = zmq.Context()
    publics, server = keys[0].publics, keys[0].publics[1]
    stranger = zmq.curve_keypair()
    try:
        # a stranger; member 2 as itself; member 2 as member 0 (its key claimed, its own secret used)
        for public, secret in (stranger, (publics[2], keys[2].secret), (publics[0], keys[2].secret)):
            push = _feed(links[1].bound, server, public, secret, context)
            with pytest.raises(MemberTimeout, match="member 0: sent nothing"):
                links[1].recv("act", timeout=1.0)  # member 1 hears only member 0
            push.close()
        push = _feed(links[1].bound, server, publics[0], keys[0].secret, context)  # member 0's secret
        assert links[1].recv("act", timeout=2.0).header["step"] == 7
        push.close()
    finally:
        context.term()
        for link in links:
            link.close()


def test_a_member_holds_only_its_own_secret_and_a_link_refuses_keys_not_its_own() -> None:
    keys = local_keys(3)
    assert len({k.secret for k in keys}) == 3 and all(k.publics == keys[0].publics for k in keys)
    assert [zmq.curve_public(k.secret) for k in keys] == list(keys[0].publics)
    assert MemberKeys.from_hex(*keys[1].hex()) == keys[1]  # as a worker hands them to its task
    with pytest.raises(ValueError, match="not that of key 1"):
        MemberLink(1, keys[2], "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", max_frame_bytes=1024)
    with pytest.raises(ValueError, match="64 hex"):
        MemberKeys.from_hex(keys[1].hex()[0], keys[1].hex()[1] + ",abcd")


def test_an_oversized_frame_never_arrives_and_a_malformed_one_is_refused() -> None:
    links = ring(local_keys(2), max_frame_bytes=1024)
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
    listening outbox hands frames only to a peer that holds member 1's secret: not a stranger, nor
    member 2 claiming member 1's key."""
    keys, n = local_keys(3), 3
    ports = [stable_port() for _ in range(n)]
    out0 = f"tcp://127.0.0.1:{stable_port()}"
    inbox = [f"tcp://127.0.0.1:{p}" for p in ports]
    links = [
        MemberLink(0, keys[0], inbox[0], None, outbox_bind=out0, max_frame_bytes=1 << 20, timeout=2.0),
        MemberLink(1, keys[1], None, inbox[2], inbox_dial=out0, max_frame_bytes=1 << 20, timeout=2.0),
        MemberLink(2, keys[2], inbox[2], inbox[0], max_frame_bytes=1 << 20, timeout=2.0),
    ]
    context = zmq.Context()
    thieves = [context.socket(zmq.PULL) for _ in range(2)]  # dial the listening outbox as its next member
    for thief, (public, secret) in zip(thieves, (zmq.curve_keypair(), (keys[2].publics[1], keys[2].secret)),
                                       strict=True):  # fmt: skip
        thief.curve_server, thief.curve_publickey, thief.curve_secretkey = True, public, secret
        thief.setsockopt(zmq.LINGER, 0)
    try:
        for link in links:
            link.connect()
        for thief in thieves:
            thief.connect(out0)
        for step in range(4):  # PUSH would deal frames round-robin to every peer that shook hands
            sent = torch.full((1, 2, 8), float(step)).to(torch.bfloat16)
            links[0].send({"kind": "act", "step": step}, sent)
            frame = links[1].recv("act")
            assert frame.header["step"] == step and torch.equal(frame.tensor, sent)
        assert all(thief.poll(500) == 0 for thief in thieves)
        links[1].send({"kind": "act", "step": 9}, torch.zeros(1, 2, 8, dtype=torch.bfloat16))
        assert links[2].recv("act").header["step"] == 9
        links[2].send({"kind": "tok", "tokens": [3]})
        assert links[0].recv("tok").header["tokens"] == [3]  # round the ring
    finally:
        for thief in thieves:
            thief.close()
        context.term()
        for link in links:
            link.close()


def test_a_link_opened_from_neither_end_is_refused() -> None:
    with pytest.raises(ValueError, match="either binds or dials"):
        MemberLink(0, local_keys(2)[0], None, "tcp://127.0.0.1:1", max_frame_bytes=1024)
