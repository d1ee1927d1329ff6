"""A wrong answer to a hardware challenge is evidence (docs/hardware.md): the challenge, the node's signed
commitment, the challenger's secret and the node's signed answer convict it before anyone who re-runs
the check, with nothing but themselves. The orchestrator judges with this when it challenges; the pool
owner re-runs it on what the orchestrator recorded (`intellect-pool hardware-evidence`)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from intellect import hardware
from intellect.identity import verify_message
from intellect.wire.hardware import HardwareChallenge, answer_text, commitment_text


def unsigned(address: str, challenge: HardwareChallenge, commitment: dict[str, Any], secret: bytes,
             answer: dict[str, Any]) -> list[str]:  # fmt: skip
    """Why the commitment and the answer are not `address`'s own words for `challenge` and `secret`
    ([]: they are). An answer signed for another secret is not evidence for this one: it was right
    or wrong for its own probe, and another probe says nothing of it."""
    reasons = []
    if {commitment["challenge_id"], answer["challenge_id"]} != {challenge.challenge_id}:
        reasons.append("the commitment or the answer is for another challenge")
    if commitment["node_address"].lower() != address.lower():
        reasons.append(f"the commitment names node {commitment['node_address']}, not {address}")
    said = commitment_text(challenge, address, commitment["root"])
    if not verify_message(said, commitment["signature"], address):
        reasons.append("the commitment is not signed by the node's key")
    text = answer_text(challenge.challenge_id, address, secret.hex(), answer["cr"], answer["rows"],
                       answer["proofs"])
    if not verify_message(text, answer["signature"], address):
        reasons.append("the answer is not signed by the node's key for this secret")
    return reasons


def judge(address: str, challenge: HardwareChallenge, commitment: dict[str, Any], secret: bytes,
          answer: dict[str, Any],
          a: np.ndarray | None = None, b: np.ndarray | None = None) -> list[str]:  # fmt: skip
    """Why the node's answer is wrong ([] when it is right), from the evidence alone: what the pool
    owner (or anyone) re-runs on a recorded wrong answer."""
    if a is None or b is None:
        a, b = hardware.matrices(challenge.challenge_id, address, challenge.n, challenge.precision)
    reasons = unsigned(address, challenge, commitment, secret, answer)
    if reasons:  # unsigned words are no evidence: judged, but nothing below would be the node's
        return reasons
    # the probe opens as many rows as the node's signed answer holds: a challenger cannot claim it
    # asked for more than the node answered (the challenger refuses a short opening itself, off chain)
    probe = hardware.probe(secret, challenge.n, len(answer["rows"]))
    result = hardware.check(a, b, challenge.precision, commitment["root"], probe, answer["cr"],
                            answer["rows"], answer["proofs"])  # fmt: skip
    return result.reasons


def judge_unopened(address: str, evidence: dict[str, Any]) -> tuple[str, list[str]]:
    """A commitment the node never opened (`unopened`: what happened instead). ("unopened", what
    happened) when the commitment is the node's signed words, else ("unsigned", why not). Never
    "wrong": that the opening did not come (or came late, or malformed) rests on the challenger's word
    alone, so it refuses invites and placement off chain and takes no stake (docs/hardware.md)."""
    try:
        challenge = HardwareChallenge.model_validate(evidence["challenge"])
        commitment = dict(evidence["commitment"])
        said = commitment_text(challenge, address, str(commitment["root"]))
        signed = verify_message(said, str(commitment["signature"]), address)
        happened = str(evidence["unopened"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a hardware challenge's evidence: {type(exc).__name__} {exc}") from None
    if not signed or commitment.get("challenge_id") != challenge.challenge_id:
        return "unsigned", ["the commitment is not signed by the node's key for this challenge"]
    return "unopened", [f"committed, not opened: {happened}"]


def judge_evidence(address: str, evidence: dict[str, Any]) -> tuple[str, list[str]]:
    """One recorded piece of evidence (`challenge`, `commitment`, `secret`, `answer`, as `GET
    /nodes/{address}/hardware` lists it) judged again: ("wrong", reasons) when it convicts `address`
    (its own signed words contradict the challenge), ("unsigned", reasons) when the words are not
    its own (no evidence), ("right", []) when the answer holds, ("unopened", what happened) for a
    signed commitment that was never opened (`judge_unopened`: no stake). A record that is not
    evidence at all raises ValueError."""
    if isinstance(evidence, dict) and "unopened" in evidence and "answer" not in evidence:
        return judge_unopened(address, evidence)
    try:
        challenge = HardwareChallenge.model_validate(evidence["challenge"])
        secret = bytes.fromhex(evidence["secret"])
        commitment, answer = dict(evidence["commitment"]), dict(evidence["answer"])
        for key in ("challenge_id", "node_address", "root", "signature"):
            str(commitment[key])
        for key in ("challenge_id", "cr", "rows", "proofs", "signature"):
            answer[key]  # noqa: B018
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a hardware challenge's evidence: {type(exc).__name__} {exc}") from None
    not_its_own = unsigned(address, challenge, commitment, secret, answer)
    if not_its_own:
        return "unsigned", not_its_own
    reasons = judge(address, challenge, commitment, secret, answer)
    return ("wrong", reasons) if reasons else ("right", [])


EVIDENCE_KEYS = ("challenge", "commitment", "secret", "answer")


def evidence_digest(evidence: dict[str, Any]) -> bytes:
    """sha256 of the evidence's canonical JSON (its four parts, keys sorted): what a slash vote names on
    chain (`intellect-pool slashing hardware`), so that anyone holding the evidence can find the vote
    and anyone reading the vote can ask for exactly that evidence."""
    try:
        parts = {key: evidence[key] for key in EVIDENCE_KEYS}
    except KeyError as exc:
        raise ValueError(f"not a hardware challenge's evidence: no {exc}") from None
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).digest()
