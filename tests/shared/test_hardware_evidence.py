"""Evidence that takes stake is the node's own words, all of them (intellect/hardware_evidence.py): a
right answer stays right, a wrong answer the node signed convicts it, and nobody can turn an honest
node's signed answer into a conviction by pairing it with another secret (another probe)."""

from __future__ import annotations

import secrets

from intellect.hardware_evidence import evidence_digest, judge_evidence
from intellect.identity import Wallet
from intellect.wire.hardware import HardwareChallenge, HardwareReveal, answer_text
from worker.proof import HardwareProver


def answered(wallet: Wallet, n: int = 48) -> dict:
    """One honest round: the challenge, the node's signed commitment, the secret and its signed answer."""
    prover = HardwareProver(wallet.address, wallet.sign_message)
    challenge = HardwareChallenge(challenge_id=secrets.token_hex(32), n=n, precision="float32")
    commitment = prover.commit(challenge)
    secret = secrets.token_hex(32)
    answer = prover.reveal(HardwareReveal(challenge_id=challenge.challenge_id, secret=secret))
    return {"challenge": challenge.model_dump(), "commitment": commitment.model_dump(), "secret": secret,
            "answer": answer.model_dump()}  # fmt: skip


def test_an_honest_answer_is_right_and_cannot_be_framed_with_another_secret() -> None:
    node = Wallet.create()
    evidence = answered(node)
    assert judge_evidence(node.address, evidence) == ("right", [])
    # the challenger (or anyone holding the answer) swaps the secret: the probe changes, the honest C·r
    # would fail it, but the node never signed an answer to that secret
    framed = {**evidence, "secret": secrets.token_hex(32)}
    kind, reasons = judge_evidence(node.address, framed)
    assert kind == "unsigned" and "for this secret" in " ".join(reasons)
    # nor does it convict anyone else under whose name it is presented
    assert judge_evidence(Wallet.create().address, evidence)[0] == "unsigned"


def test_a_wrong_answer_the_node_signed_convicts_it_and_its_digest_is_stable() -> None:
    node = Wallet.create()
    evidence = answered(node)
    answer = dict(evidence["answer"])
    answer["cr"] = [x + 1000.0 for x in answer["cr"]]  # a C·r of some other product
    said = answer_text(answer["challenge_id"], node.address, evidence["secret"], answer["cr"], answer["rows"],
                       answer["proofs"])  # fmt: skip
    answer["signature"] = node.sign_message(said)
    wrong = {**evidence, "answer": answer}
    kind, reasons = judge_evidence(node.address, wrong)
    assert kind == "wrong" and reasons[0].startswith("freivalds")
    # the digest a slash vote names: the same for the same evidence whatever its key order, another for
    # other evidence
    reordered = dict(reversed(list(wrong.items())))
    assert evidence_digest(reordered) == evidence_digest(wrong) != evidence_digest(evidence)
    assert len(evidence_digest(wrong)) == 32
