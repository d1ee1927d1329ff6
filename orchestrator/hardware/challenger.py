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

import numpy as np
import structlog
from pydantic import ValidationError

from intellect import hardware
from intellect.errors import PeerError
from intellect.identity import verify_message
from intellect.wire.hardware import HardwareChallenge, HardwareReveal, answer_text, commitment_text
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


def judge(address: str, challenge: HardwareChallenge, commitment: dict, secret: bytes, answer: dict,
          a: np.ndarray | None = None, b: np.ndarray | None = None) -> list[str]:  # fmt: skip
    """Why the node's answer is wrong ([] when it is right), from the evidence alone: what the pool
    owner (or anyone) re-runs on a recorded wrong answer."""
    if a is None or b is None:
        a, b = hardware.matrices(challenge.challenge_id, address, challenge.n, challenge.precision)
    reasons = []
    if {commitment["challenge_id"], answer["challenge_id"]} != {challenge.challenge_id}:
        reasons.append("the commitment or the answer is for another challenge")
    if commitment["node_address"].lower() != address.lower():
        reasons.append(f"the commitment names node {commitment['node_address']}, not {address}")
    said = commitment_text(challenge, address, commitment["root"])
    if not verify_message(said, commitment["signature"], address):
        reasons.append("the commitment is not signed by the node's key")
    text = answer_text(challenge.challenge_id, address, answer["cr"], answer["rows"], answer["proofs"])
    if not verify_message(text, answer["signature"], address):
        reasons.append("the answer is not signed by the node's key")
    if reasons:  # unsigned words are no evidence: judged, but nothing below would be the node's
        return reasons
    probe = hardware.probe(secret, challenge.n)
    result = hardware.check(a, b, challenge.precision, commitment["root"], probe, answer["cr"],
                            answer["rows"], answer["proofs"])  # fmt: skip
    return result.reasons
