"""The links between a group's members: ZeroMQ over TCP, CURVE-authenticated, bounded frames.

Why ZeroMQ (pyzmq): message framing, reconnection after a dropped link, per-socket size limits
(`MAXMSGSIZE`: an oversized frame drops the connection before it is buffered) and CURVE (elliptic
curve authentication and encryption, with a ZAP hook that decides which client keys may connect) are
all in one well-kept library, with no broker and no code generation (gRPC would add both).

Each member binds one inbox (PULL, CURVE server) and connects one outbox (PUSH) to the next member's
inbox, in a ring: activations flow stage 0 → 1 → … → n-1, sampled tokens flow n-1 → 0. A member
behind NAT cannot be called, so on its links the connection goes the other way, keeping the roles:
its inbox dials its predecessor's outbox, which listens (`inbox_dial`, `outbox_bind`); its outbox
dials the next member's inbox as usual. Which end listens is transport only: the inbox is the CURVE
server whichever way the TCP connection was opened, so it still admits its predecessor's key alone,
and a listening outbox is a CURVE client that completes a handshake only with a peer holding the
next member's key. Every link needs one end that can be called (docs/storage-and-groups.md). Each
member holds its own CURVE secret and every member's public key (`MemberKeys`: the task's
`${MEMBER_SECRET}` and `${GROUP_KEYS}`): an inbox accepts exactly one client key, its predecessor's,
and only the predecessor holds the matching secret, so nobody outside the group, nor another member,
can feed it. (Keys all derived from one group secret would let any member take another's key, feed
member k as k-1 and get the honest k-1 named.) A peer that
sends nothing for `timeout` seconds raises `MemberTimeout` naming it; a frame that is not what the
protocol expects raises `MemberMisbehaved`.

Byte for byte (`LinkLog`): within a batch each end keeps the exact bytes of every frame it sent and
received and a running sha256 over them (`frames_digest`). At the end of a batch the sender signs the
digest of what it sent with its own node key and the receiver countersigns the digest of what it got
(`member.py`, `commit.py`): CURVE tells the receiver who is on the other end but proves nothing to a
third party (its authentication is deniable), so only the node keys can show a validator who sent
what. Frames outside a batch (hello, seal, bundle) are not logged.

Routes: a group keeps several batches in flight on the same links (`flight.py`), so every frame
travels behind a route part, the 8-byte number of the batch it belongs to (0: the ring's own frames,
hello and close). The route is not logged: a batch's logged frames are byte for byte those of the
same batch run alone, and the seals commit to them. A member that mislabels a frame only puts it in
another batch's log, whose seal then does not match (nobody paid, nobody judged).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

# A frame's JSON header: a step's tokens, or at the end of a batch every stage's proofs and the whole
# bundle (a batch of 64 rows × 16 tokens through 2 stages is ~200 KB of hex and token ids). Bounded
# before it is parsed (a quarter of the link's frame limit, at least this); only the group's members
# can send one at all.
MIN_HEADER_BYTES = 64 * 1024
# A frame's header as a validator reads it back from a member's file (the file itself is capped first).
FILE_HEADER_BYTES = 1 << 20
RING = 0  # the route of frames that belong to no batch (hello, close)
ROUTE_BYTES = 8
_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


class MemberError(RuntimeError):
    """A group member failed the protocol; `member` is its index (the one to report). Not
    `intellect.errors.PeerError`, which is about HTTP services: a member is named by its stage index."""

    def __init__(self, member: int, reason: str) -> None:
        super().__init__(f"member {member}: {reason}")
        self.member = member
        self.reason = reason


class MemberTimeout(MemberError):
    """The member sent nothing within the timeout (dead, partitioned or too slow)."""


class MemberMisbehaved(MemberError):
    """The member sent something the protocol forbids (a wrong shape, a proof that does not match
    what it sent)."""


@dataclass(frozen=True)
class MemberKeys:
    """One member's CURVE keys (z85): its own secret, told to no other member, and every member's public
    key in stage order, from which its links take the predecessor's (the one client its inbox admits)
    and the successor's (the server its outbox talks to)."""

    secret: bytes = field(repr=False)
    publics: tuple[bytes, ...] = ()

    @classmethod
    def from_hex(cls, secret: str, publics: str) -> MemberKeys:
        """From the task's `${MEMBER_SECRET}` and `${GROUP_KEYS}` (comma-separated): hex on the way in,
        since z85 text holds characters a shell or a template would trip on."""
        raw = [bytes.fromhex(secret), *(bytes.fromhex(p) for p in publics.split(","))]
        if any(len(key) != 32 for key in raw):
            raise ValueError("a CURVE key is 32 bytes (64 hex characters)")
        return cls(z85.encode(raw[0]), tuple(z85.encode(key) for key in raw[1:]))

    def check(self, index: int) -> None:
        """Refuse keys that cannot be member `index`'s (a wrong list or another member's secret) before a
        model loads, rather than as handshakes that never complete."""
        if not 0 <= index < len(self.publics) or zmq.curve_public(self.secret) != self.publics[index]:
            raise ValueError(f"this member's secret is not that of key {index} of the group's "
                             f"{len(self.publics)}")

    def hex(self) -> tuple[str, str]:
        """(`${MEMBER_SECRET}`, `${GROUP_KEYS}`) as a worker would hand them to the member."""
        return z85.decode(self.secret).hex(), ",".join(z85.decode(p).hex() for p in self.publics)


def local_keys(members: int) -> list[MemberKeys]:
    """Keys of a group run on one machine (tests, benches, the devnet): a fresh keypair per member, as
    the orchestrator gives a worker's group, so a local group is held to the same rule."""
    pairs = [zmq.curve_keypair() for _ in range(members)]
    publics = tuple(public for public, _ in pairs)
    return [MemberKeys(secret, publics) for _, secret in pairs]


class _OnlyKey:
    """ZAP credentials provider: exactly one client public key may connect."""

    def __init__(self, public: bytes) -> None:
        self.allowed = public  # z85, as the authenticator hands client keys to the callback

    def callback(self, domain: str, key: bytes) -> bool:
        return hmac.compare_digest(key, self.allowed)


@dataclass
class Frame:
    header: dict[str, Any]
    tensor: torch.Tensor | None


def frames_digest(frames: list[list[bytes]]) -> str:
    """sha256 over frames as they crossed a link: per frame its part count, per part its length and
    bytes (so no two different frame sequences hash alike by moving a boundary)."""
    digest = hashlib.sha256()
    for parts in frames:
        digest.update(len(parts).to_bytes(4, "big"))
        for part in parts:
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
    return digest.hexdigest()


class LinkLog:
    """One direction of a link over one batch: every frame's exact bytes, in order."""

    def __init__(self) -> None:
        self.frames: list[list[bytes]] = []

    def add(self, parts: list[bytes]) -> None:
        self.frames.append([bytes(p) for p in parts])

    def digest(self) -> str:
        return frames_digest(self.frames)


def frame_parts(header: dict[str, Any], tensor: torch.Tensor | None = None) -> list[bytes]:
    """A frame's bytes: its JSON header (with the tensor's shape and dtype) and the tensor's raw bytes.
    The one encoding of frames on the wire and in the logs the seals commit to."""
    head = json.dumps(header | ({"shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix(
        "torch.")} if tensor is not None else {})).encode()  # fmt: skip
    if tensor is None:
        return [head]
    return [head, tensor.contiguous().view(torch.uint8).numpy().tobytes()]


def parse_frame(member: int, parts: list[bytes], max_header_bytes: int) -> Frame:
    """A frame's parts as a receiver (or a validator reading a member's file) parses them."""
    if len(parts) not in (1, 2):
        raise MemberMisbehaved(member, f"a frame of {len(parts)} parts")
    if len(parts[0]) > max_header_bytes:
        raise MemberMisbehaved(member, f"a frame header of {len(parts[0])} bytes (limit {max_header_bytes})")
    try:
        header = json.loads(parts[0])
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        raise MemberMisbehaved(member, "a frame header that is not JSON") from None
    if not isinstance(header, dict):
        raise MemberMisbehaved(member, f"a frame header that is not an object: {str(header)[:100]}")
    return Frame(header, _tensor(member, header, parts[1]) if len(parts) == 2 else None)


class MemberLink:
    """Member `index`'s inbox (bound at `bind`, or dialling `inbox_dial`: the predecessor's listening
    outbox) and outbox (connected to `next_address`, or listening at `outbox_bind` for a next member
    behind NAT)."""

    def __init__(self, index: int, keys: MemberKeys, bind: str | None, next_address: str | None, *,
                 max_frame_bytes: int, timeout: float = 30.0, inbox_dial: str | None = None,
                 outbox_bind: str | None = None) -> None:  # fmt: skip
        if (bind is None) == (inbox_dial is None) or (next_address is None) == (outbox_bind is None):
            raise ValueError("a member's inbox either binds or dials, and so does its outbox")
        keys.check(index)
        members = len(keys.publics)
        self.index, self.members, self.timeout = index, members, timeout
        self.prev, self.next = (index - 1) % members, (index + 1) % members
        self.context = zmq.Context()
        public, secret = keys.publics[index], keys.secret
        self.auth = ThreadAuthenticator(self.context)
        self.auth.start()
        self.auth.configure_curve_callback(domain="*", credentials_provider=_OnlyKey(keys.publics[self.prev]))
        self.inbox = self.context.socket(zmq.PULL)
        self.inbox.curve_server = True
        self.inbox.curve_secretkey = secret
        self.inbox.curve_publickey = public
        self.max_header_bytes = max(MIN_HEADER_BYTES, max_frame_bytes // 4)
        self.inbox.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes + self.max_header_bytes)
        self.inbox.setsockopt(zmq.LINGER, 0)
        if inbox_dial is not None:
            self.inbox.connect(inbox_dial)
        else:
            self.inbox.bind(bind or "")
        self.bound = str(self.inbox.getsockopt_string(zmq.LAST_ENDPOINT))
        self.outbox = self.context.socket(zmq.PUSH)
        self.outbox.curve_secretkey = secret
        self.outbox.curve_publickey = public
        self.outbox.curve_serverkey = keys.publics[self.next]
        self.outbox.setsockopt(zmq.LINGER, 2000)
        self.outbox.setsockopt(zmq.SNDTIMEO, int(timeout * 1000))
        self.next_address = next_address
        self.outbox_bind = outbox_bind
        self.bytes_sent = 0
        self.bytes_received = 0

    def connect(self, next_address: str | None = None) -> None:
        """Open the outbox: dial the next member's inbox, or listen for it (`outbox_bind`)."""
        if self.outbox_bind is not None and next_address is None:
            self.outbox.bind(self.outbox_bind)
            return
        target = next_address or self.next_address
        if target is None:
            raise ValueError("the outbox has no next member's address to dial")
        self.outbox.connect(target)

    def send(self, header: dict[str, Any], tensor: torch.Tensor | None = None, *, route: int = RING,
             log: LinkLog | None = None) -> int:
        """Send one frame on `route`, kept in `log` (a batch's frames) when given; returns the bytes sent."""
        parts = frame_parts(header, tensor)
        try:
            self.outbox.send_multipart([route.to_bytes(ROUTE_BYTES, "big"), *parts], copy=False)
        except zmq.Again:
            raise MemberTimeout(self.next, f"did not take a frame within {self.timeout:.0f} s") from None
        size = ROUTE_BYTES + sum(len(p) for p in parts)
        self.bytes_sent += size
        if log is not None:
            log.add(parts)
        return size

    def recv_routed(self, timeout: float | None = None) -> tuple[int, list[bytes]]:
        """The next frame off the inbox: its route and its parts, not yet parsed."""
        wait = timeout or self.timeout
        deadline = time.monotonic() + wait
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.inbox.poll(max(1, int(left * 1000))):
                raise MemberTimeout(self.prev, f"sent nothing for {wait:.0f} s")
            try:  # readable can still mean nothing whole to read (a frame dropped for its size)
                parts = self.inbox.recv_multipart(flags=zmq.NOBLOCK, copy=True)
                break
            except zmq.Again:
                time.sleep(0.01)
        self.bytes_received += sum(len(p) for p in parts)
        if len(parts) < 2 or len(parts[0]) != ROUTE_BYTES:
            raise MemberMisbehaved(self.prev, "a frame without its route (the batch it belongs to)")
        return int.from_bytes(parts[0], "big"), parts[1:]

    def parse(self, parts: list[bytes], kind: str) -> Frame:
        """A frame's parts as this member expects them: of `kind` (or `end`, which ends a batch)."""
        frame = parse_frame(self.prev, parts, self.max_header_bytes)
        if frame.header.get("kind") not in (kind, "end"):
            raise MemberMisbehaved(self.prev, f"expected a {kind!r} frame, got {str(frame.header)[:100]}")
        return frame

    def recv(self, kind: str, timeout: float | None = None, *, route: int = RING,
             log: LinkLog | None = None) -> Frame:
        """The next frame, which must be on `route` and of `kind` (or `end`); kept in `log` when given.
        For a member with one thing to wait for (the hello round, tests); batches in flight are
        demultiplexed by `flight.py`."""
        got, parts = self.recv_routed(timeout)
        if got != route:
            raise MemberMisbehaved(self.prev, f"a frame for batch {got} while waiting on {route}")
        frame = self.parse(parts, kind)
        if log is not None:
            log.add(parts)
        return frame

    def close(self) -> None:
        self.inbox.close(0)
        self.outbox.close()
        self.auth.stop()
        self.context.term()


def _tensor(member: int, header: dict[str, Any], payload: bytes) -> torch.Tensor:
    shape, dtype = header.get("shape"), _DTYPES.get(str(header.get("dtype")))
    if dtype is None or not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise MemberMisbehaved(member, f"a tensor of dtype {header.get('dtype')!r} and shape {shape!r}")
    count = 1
    for d in shape:
        count *= d
    if count * torch.empty(0, dtype=dtype).element_size() != len(payload):
        raise MemberMisbehaved(member, f"{len(payload)} bytes for a {dtype} tensor of shape {shape}")
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(dtype).reshape(shape)
