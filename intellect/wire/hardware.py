"""The hardware challenge's messages (intellect/hardware.py has the math; docs/hardware.md the protocol).

challenger → node  `POST /hardware/challenge`  HardwareChallenge   → HardwareCommitment (signed root)
challenger → node  `POST /hardware/reveal`     HardwareReveal      → HardwareAnswer (signed C·r, rows)

Both requests are signed by the pool's manager (or a validator); both answers are signed by the
node's key over a fixed text, so a wrong answer is evidence anyone can check again: the challenge id
and size give A and B, the secret gives the probe, and the signed commitment and answer are the
node's own words.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated

from pydantic import Field

from intellect.hardware import MAX_N, PRECISIONS, ROWS_OPENED
from intellect.wire.base import WireModel

HEX32 = r"^[0-9a-f]{64}$"
Row = Annotated[list[float], Field(max_length=MAX_N)]
Proof = Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=64)]  # depth ≤ 13 at MAX_N
# The largest honest answer: C·r and 64 rows of MAX_N numbers (~25 bytes each in JSON, 13.5 MB) and 64
# proofs (55 kB).
MAX_ANSWER_BYTES = 16 * 1024 * 1024
PRECISION_PATTERN = "^(" + "|".join(PRECISIONS) + ")$"


class HardwareChallenge(WireModel):
    challenge_id: str = Field(pattern=HEX32, description="32 random bytes (hex) drawn by the challenger")
    n: int = Field(ge=1, le=MAX_N, description="A and B are n × n")
    precision: str = Field(pattern=PRECISION_PATTERN, description=", ".join(PRECISIONS))


class HardwareCommitment(WireModel):
    challenge_id: str = Field(pattern=HEX32)
    node_address: str
    root: str = Field(pattern=HEX32, description="Merkle root over C's rows (float32 bytes)")
    seconds: float = Field(ge=0, description="the node's own timing of its product (not trusted)")
    signature: str = Field(pattern=r"^0x[0-9a-fA-F]{130}$", description="node key, over commitment_text")


class HardwareReveal(WireModel):
    challenge_id: str = Field(pattern=HEX32)
    secret: str = Field(pattern=HEX32, description="the challenger's secret, the probe's seed (r and rows)")
    opened: int = Field(default=ROWS_OPENED, ge=1, le=64,
                        description="rows to open (min(opened, n)); the signed answer's row count says "
                        "how many were: its evidence needs no more")  # fmt: skip


class HardwareAnswer(WireModel):
    challenge_id: str = Field(pattern=HEX32)
    cr: list[float] = Field(max_length=MAX_N, description="C·r")
    rows: list[Row] = Field(max_length=64, description="the asked rows of C, in the probe's order")
    proofs: list[Proof] = Field(max_length=64, description="each row's Merkle proof, leaf first")
    signature: str = Field(pattern=r"^0x[0-9a-fA-F]{130}$", description="node key, over answer_text")


def commitment_text(challenge: HardwareChallenge, node_address: str, root: str) -> str:
    return (f"intellect-hardware/1 commit {challenge.challenge_id} n={challenge.n} "
            f"precision={challenge.precision} node={node_address.lower()} root={root}")  # fmt: skip


def answer_text(challenge_id: str, node_address: str, secret: str, cr: list[float], rows: list[list[float]],
                proofs: list[list[str]]) -> str:  # fmt: skip
    """What the node signs for its reveal: the secret it answers (the probe's seed) and the digest of the
    answer's canonical JSON. The secret is in the signed words so that nobody holding an honest
    answer can pair it with another secret (another probe, which the answer would fail) and present
    that as the node's wrong answer: evidence that takes stake must be the node's words, all of it."""
    body = json.dumps({"cr": cr, "rows": rows, "proofs": proofs}, separators=(",", ":"))
    digest = hashlib.sha256(body.encode()).hexdigest()
    return (f"intellect-hardware/2 answer {challenge_id} node={node_address.lower()} "
            f"secret={secret.lower()} sha256={digest}")  # fmt: skip


MAX_PEERS = 16  # peer inboxes measured per request: a few seconds of handshakes at most


class RoundTripRequest(WireModel):
    """Peer inboxes (host:port) of other pool members to measure, from the pool's manager."""

    peers: list[Annotated[str, Field(min_length=3, max_length=255)]] = Field(
        min_length=1, max_length=MAX_PEERS)


class RoundTripReport(WireModel):
    ms: list[float | None] = Field(max_length=MAX_PEERS, description="the shortest of 3 TCP handshakes to "
                                   "each peer, in the request's order; null: not reached")  # fmt: skip
