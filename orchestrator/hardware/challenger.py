"""The orchestrator's side of the hardware challenge (intellect/hardware.py; docs/hardware.md).

`challenge_node` measures the round trip to the node's API, sends a fresh challenge, times the
commitment, reveals the probe, checks the answer and returns what was proven:

- proven: FLOP/s ≥ 2n³ / (commitment time − round trip), the round trip taken off at most half the
  commitment time (a node answers the probes that measure it and could slow them: that bounds what
  it gains to 2×), recorded with the round trip; placement goes by it (orchestrator/groups/formation.py);
- wrong: the answer contradicts the challenge (Freivalds, a row, a Merkle proof or a signature),
  recorded with the evidence (challenge, signed commitment, secret, signed answer), which anyone can
  check again (`intellect.hardware.check`); the node is not invited;
- unanswered: unreachable, refused, too slow or malformed; nothing is proven and nothing is held
  against the node beyond having no figure (placed after the nodes with one).
"""

from __future__ import annotations

import asyncio
import secrets
import time

import structlog
from pydantic import ValidationError

from intellect import hardware
from intellect.errors import PeerError
from intellect.hardware_evidence import judge
from intellect.wire.hardware import HardwareChallenge, HardwareReveal
from orchestrator.clients import SignedClient
from orchestrator.store.hardware import PROVEN, UNANSWERED, WRONG, ProofRecord

log = structlog.get_logger("intellect.orchestrator.hardware")


async def challenge_node(peers: SignedClient, address: str, worker_url: str, n: int, precision: str,
                         timeout: float) -> ProofRecord:  # fmt: skip
    def unanswered(reason: str, rtt: float | None = None) -> ProofRecord:
        return ProofRecord(node_address=address, outcome=UNANSWERED, n=n, precision=precision,
                           rtt_ms=None if rtt is None else rtt * 1000, reasons=(reason,))  # fmt: skip

    try:
        rtt = await peers.round_trip(worker_url)
    except PeerError as exc:
        return unanswered(f"round trip: {exc}")
    challenge = HardwareChallenge(challenge_id=secrets.token_hex(32), n=n, precision=precision)
    # A and B are built while the node computes: the check needs them, the timing does not
    matrices = asyncio.create_task(
        asyncio.to_thread(hardware.matrices, challenge.challenge_id, address, n, precision))
    started = time.perf_counter()
    try:
        commitment = await peers.hardware_challenge(worker_url, challenge, timeout)
        elapsed = time.perf_counter() - started
    except (PeerError, ValidationError) as exc:
        matrices.cancel()
        return unanswered(f"challenge: {exc}"[:500], rtt)
    secret = secrets.token_bytes(32)
    try:
        reveal = HardwareReveal(challenge_id=challenge.challenge_id, secret=secret.hex())
        answer = await peers.hardware_reveal(worker_url, reveal, timeout)
    except (PeerError, ValidationError) as exc:
        matrices.cancel()
        return unanswered(f"reveal: {exc}"[:500], rtt)
    a, b = await matrices
    verdict = await asyncio.to_thread(judge, address, challenge, commitment.model_dump(), secret,
                                      answer.model_dump(), a, b)  # fmt: skip
    # At most half the challenge's time is taken off for the link: the node answers the round-trip
    # probes itself and could delay them to shrink its time, so its proven figure can exceed what it
    # computed at by 2× at most (an honest node on a slow link is only underestimated).
    seconds = elapsed - min(rtt, elapsed / 2)
    if verdict:
        evidence = {"challenge": challenge.model_dump(), "commitment": commitment.model_dump(),
                    "secret": secret.hex(), "answer": answer.model_dump()}  # fmt: skip
        log.warning("hardware challenge answered wrongly", node=address, reasons=verdict[:3])
        return ProofRecord(node_address=address, outcome=WRONG, n=n, precision=precision, rtt_ms=rtt * 1000,
                           seconds=seconds, reasons=tuple(verdict), evidence=evidence)  # fmt: skip
    flops = hardware.proven_flops(n, seconds)
    log.info("hardware proven", node=address, n=n, precision=precision, gflops=round(flops / 1e9, 2),
             rtt_ms=round(rtt * 1000, 2))  # fmt: skip
    return ProofRecord(node_address=address, outcome=PROVEN, n=n, precision=precision, flops=flops,
                       rtt_ms=rtt * 1000, seconds=seconds)  # fmt: skip
