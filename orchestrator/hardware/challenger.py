"""The orchestrator's side of the hardware challenge (intellect/hardware.py; docs/hardware.md).

`challenge_node` measures the round trip to the node's API, sends a fresh challenge, times the
commitment, reveals the probe, checks the answer and returns what was proven:

- proven: FLOP/s ≥ 2n³ / (challenge sent → commitment received, on this side's clock). Nothing is
  subtracted: the round trip is measured by probes the node answers itself, so subtracting it let a
  node that delayed them prove up to 2× its speed (issue 56); now delaying anything only lowers its
  figure, and an honest node far away is understated by one round trip. Placement goes by it
  (orchestrator/groups/formation.py);
- wrong: the node's own signed answer contradicts the challenge (Freivalds, a row, a Merkle proof),
  recorded with the evidence (challenge, signed commitment, secret, signed answer), which anyone can
  check again (`intellect.hardware_evidence`) and which the pool's validators may slash;
- unopened: the node sent a signed commitment and then did not open it (refused, timed out, opened
  fewer rows than asked, another challenge, an answer not signed by it, malformed). It saw the probe
  before it chose not to answer, so this is no opt-out: it fails the invite and placement exactly as
  wrong does, and is recorded with the challenge, the signed commitment, the secret and what happened.
  It takes no stake: only the node's signed wrong answer convicts before a third party;
- unanswered: no valid signed commitment came (unreachable, e.g. behind NAT, refused, too slow,
  malformed, or not signed by the node). The node never saw the probe, so it chose nothing by it:
  nothing is proven and nothing is held against it beyond having no figure.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import numpy as np
import structlog
from pydantic import ValidationError

from intellect import hardware
from intellect.errors import PeerError
from intellect.hardware_evidence import judge, unsigned
from intellect.identity import verify_message
from intellect.wire.hardware import (
    HardwareAnswer,
    HardwareChallenge,
    HardwareCommitment,
    HardwareReveal,
    commitment_text,
)
from orchestrator.clients import SignedClient
from orchestrator.store.hardware import PROVEN, UNANSWERED, UNOPENED, WRONG, ProofRecord

log = structlog.get_logger("intellect.orchestrator.hardware")


def commitment_problem(address: str, challenge: HardwareChallenge, commitment: HardwareCommitment) -> str:
    """Why `commitment` is not `address`'s signed commitment to `challenge` ("": it is). Checked before
    the secret is revealed: a node whose commitment is not its own words never sees the probe."""
    if commitment.challenge_id != challenge.challenge_id:
        return "the commitment is for another challenge"
    if commitment.node_address.lower() != address.lower():
        return f"the commitment names node {commitment.node_address}"
    said = commitment_text(challenge, address, commitment.root)
    if not verify_message(said, commitment.signature, address):
        return "the commitment is not signed by the node's key"
    return ""


async def challenge_node(peers: SignedClient, address: str, worker_url: str, n: int, precision: str,
                         timeout: float, opened: int = hardware.ROWS_OPENED) -> ProofRecord:  # fmt: skip
    def unanswered(reason: str, rtt: float | None = None) -> ProofRecord:
        return ProofRecord(node_address=address, outcome=UNANSWERED, n=n, precision=precision,
                           rtt_ms=None if rtt is None else rtt * 1000, reasons=(reason,))  # fmt: skip

    try:
        rtt = await peers.round_trip(worker_url)  # shown, and bounds links in placement; never subtracted
    except PeerError as exc:
        return unanswered(f"round trip: {exc}")
    challenge = HardwareChallenge(challenge_id=secrets.token_hex(32), n=n, precision=precision)
    # A and B are built while the node computes: the check needs them, the timing does not
    matrices = asyncio.create_task(
        asyncio.to_thread(hardware.matrices, challenge.challenge_id, address, n, precision))
    started = time.perf_counter()
    try:
        commitment = await peers.hardware_challenge(worker_url, challenge, timeout)
        elapsed = time.perf_counter() - started  # the exchange itself, on this side's clock
    except (PeerError, ValidationError) as exc:
        matrices.cancel()
        return unanswered(f"challenge: {exc}"[:500], rtt)
    problem = commitment_problem(address, challenge, commitment)
    if problem:
        matrices.cancel()
        return unanswered(f"challenge: {problem}", rtt)
    opening = Opening(address, challenge, commitment, rtt, elapsed)
    reveal = HardwareReveal(challenge_id=challenge.challenge_id, secret=opening.secret.hex(), opened=opened)
    try:
        answer = await peers.hardware_reveal(worker_url, reveal, timeout)
    except (PeerError, ValidationError) as exc:
        matrices.cancel()
        return opening.unopened(f"reveal: {exc}"[:500])
    return await opening.judged(answer, min(opened, n), matrices)


class Opening:
    """A signed commitment and the secret revealed for it: what the answer is judged against, and the
    evidence recorded whatever the node does next."""

    def __init__(self, address: str, challenge: HardwareChallenge, commitment: HardwareCommitment,
                 rtt: float, elapsed: float) -> None:  # fmt: skip
        self.address, self.challenge, self.commitment = address, challenge, commitment
        self.rtt, self.elapsed = rtt, elapsed
        self.secret = secrets.token_bytes(32)

    def _record(self, outcome: str, reasons: list[str], evidence: dict[str, Any] | None,
                flops: float | None = None) -> ProofRecord:  # fmt: skip
        return ProofRecord(node_address=self.address, outcome=outcome, n=self.challenge.n,
                           precision=self.challenge.precision, flops=flops, rtt_ms=self.rtt * 1000,
                           seconds=self.elapsed, reasons=tuple(reasons), evidence=evidence)  # fmt: skip

    def _evidence(self, **more: Any) -> dict[str, Any]:
        return {"challenge": self.challenge.model_dump(), "commitment": self.commitment.model_dump(),
                "secret": self.secret.hex(), **more}  # fmt: skip

    def unopened(self, what: str) -> ProofRecord:
        log.warning("hardware commitment not opened", node=self.address, what=what[:200])
        return self._record(UNOPENED, [f"committed, not opened: {what}"], self._evidence(unopened=what))

    async def judged(self, answer: HardwareAnswer, rows: int,
                     matrices: asyncio.Task[tuple[np.ndarray, np.ndarray]]) -> ProofRecord:  # fmt: skip
        said = answer.model_dump()
        if answer.challenge_id != self.challenge.challenge_id or len(answer.rows) != rows:
            matrices.cancel()
            return self.unopened(f"opened {len(answer.rows)} rows of challenge {answer.challenge_id[:16]}…, "
                                 f"asked for {rows} of {self.challenge.challenge_id[:16]}…")  # fmt: skip
        not_its_own = unsigned(self.address, self.challenge, self.commitment.model_dump(), self.secret, said)
        if not_its_own:
            matrices.cancel()
            return self.unopened("; ".join(not_its_own))
        a, b = await matrices
        verdict = await asyncio.to_thread(judge, self.address, self.challenge, self.commitment.model_dump(),
                                          self.secret, said, a, b)  # fmt: skip
        if verdict:
            log.warning("hardware challenge answered wrongly", node=self.address, reasons=verdict[:3])
            return self._record(WRONG, verdict, self._evidence(answer=said))
        flops = hardware.proven_flops(self.challenge.n, self.elapsed)
        log.info("hardware proven", node=self.address, n=self.challenge.n, precision=self.challenge.precision,
                 gflops=round(flops / 1e9, 2), rtt_ms=round(self.rtt * 1000, 2))  # fmt: skip
        return self._record(PROVEN, [], None, flops=flops)
