"""Who sent what: each link's frames of a batch, committed by the sender's node key and countersigned by
the receiver's.

A member's CURVE key is its own (`transport.MemberKeys`), so a receiver knows which member is on its
link, but CURVE authentication is deniable: it proves nothing to a validator, and a receiver could
claim its predecessor sent anything. The node keys are each member's own (the worker signs for its task
through the bridge, `BridgeSigner`; the task never holds the key). For every activation link k → k+1 of
a batch the sender signs the sha256 of every frame it sent (`role` "sent") and the receiver signs the
sha256 of every frame it received (`role` "received"); both go into the batch's bundle as a
`LinkRecord`. A record whose two digests agree and whose signatures recover to the two members'
addresses proves what stage k+1 received and what stage k sent: the validator replays each stage from
that (`judge.replay.judge_member`). The token link (last → stage 0) is not committed: stage 0's input is the
bundle's tokens, which stage 0 checks are the tokens it received before it writes its file.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Protocol

from intellect.identity import IdentityError, Wallet, recover_message
from intellect.wire.bridge import claim_text

KEY_ENV = "INTELLECT_PIPELINE_NODE_KEY"  # local groups only (tests, benches): a member's own key


@dataclass(frozen=True)
class LinkClaim:
    """What one end of a link says crossed it in one batch."""

    task_id: str
    group_id: str
    batch: int
    sender: int
    receiver: int
    role: str  # "sent" (the sender's) or "received" (the receiver's)
    sha256: str

    def text(self) -> str:
        return claim_text(self.task_id, self.group_id, self.batch, self.sender, self.receiver, self.role,
                          self.sha256)  # fmt: skip


class LinkSigner(Protocol):
    """Signs a member's link claims with its node key."""

    def sign(self, claim: LinkClaim) -> str: ...


class KeySigner:
    """A key in this process (local groups of tests and benches; never a task run by a worker)."""

    def __init__(self, wallet: Wallet) -> None:
        self.wallet = wallet

    def sign(self, claim: LinkClaim) -> str:
        return self.wallet.sign_message(claim.text())


class BridgeSigner:
    """The worker signs with the node key, through the task bridge."""

    def sign(self, claim: LinkClaim) -> str:
        from workloads.bridge_client import sign_link

        return sign_link(group_id=claim.group_id, batch=claim.batch, sender=claim.sender,
                         receiver=claim.receiver, role=claim.role, sha256=claim.sha256,
                         task_id=claim.task_id)  # fmt: skip


def signer_from_env() -> LinkSigner | None:
    """A task run by a worker signs through its bridge; a local member with `KEY_ENV` with that key;
    otherwise nothing is signed (the group's files then prove nobody's fault: never a hard verdict)."""
    if os.environ.get(KEY_ENV):
        return KeySigner(Wallet.from_key(os.environ[KEY_ENV]))
    if os.environ.get("INTELLECT_SOCKET_PATH") and os.environ.get("INTELLECT_TASK_ID"):
        return BridgeSigner()
    return None


def signed_by(claim: LinkClaim, signature: str, address: str) -> bool:
    """Whether `signature` over `claim` recovers to `address` (case-insensitive)."""
    if not signature or not address:
        return False
    try:
        return recover_message(claim.text(), signature).lower() == address.lower()
    except (IdentityError, ValueError, TypeError):
        return False


@dataclass(frozen=True)
class LinkRecord:
    """Link `sender` → `sender + 1` of one batch: the sender's digest and signature, the receiver's."""

    sender: int
    sha256: str
    signature: str
    received_sha256: str = ""
    countersignature: str = ""

    @property
    def receiver(self) -> int:
        return self.sender + 1

    def header(self) -> dict[str, Any]:
        return {"sender": self.sender, "sha256": self.sha256, "signature": self.signature,
                "received_sha256": self.received_sha256, "countersignature": self.countersignature}

    @classmethod
    def from_header(cls, data: Any) -> LinkRecord:
        if not isinstance(data, dict) or not isinstance(data.get("sender"), int):
            raise ValueError("a link record must be an object naming its sender")
        fields = ("sha256", "signature", "received_sha256", "countersignature")
        if not all(isinstance(data.get(f, ""), str) and len(data.get(f, "")) <= 200 for f in fields):
            raise ValueError("a link record's digests and signatures are strings")
        return cls(int(data["sender"]), *(str(data.get(f, "")) for f in fields))

    def claims(self, task_id: str, group_id: str, batch: int) -> tuple[LinkClaim, LinkClaim]:
        base = (task_id, group_id, batch, self.sender, self.receiver)
        return LinkClaim(*base, "sent", self.sha256), LinkClaim(*base, "received", self.received_sha256)

    def problem(self, task_id: str, group_id: str, batch: int, members: list[str]) -> str | None:
        """None when both ends signed the same digest; otherwise what is wrong (a dispute or a missing or
        foreign signature: evidence that names nobody)."""
        if not 0 <= self.sender < self.receiver < len(members):
            return f"link {self.sender}->{self.receiver} is not a link of a {len(members)}-member group"
        sent, received = self.claims(task_id, group_id, batch)
        where = f"link {self.sender}->{self.receiver}"
        if not signed_by(sent, self.signature, members[self.sender]):
            return f"{where}: the sender's commitment is not signed by {members[self.sender]}"
        if not signed_by(received, self.countersignature, members[self.receiver]):
            return f"{where}: the receiver's countersignature is not signed by {members[self.receiver]}"
        if self.sha256 != self.received_sha256:
            return (f"{where}: the sender says it sent {self.sha256[:12]}…, the receiver that it got "
                    f"{self.received_sha256[:12]}…: the two disagree")
        return None


def shape_claim(task_id: str, group_id: str, batch: int, shape: dict[str, Any]) -> LinkClaim:
    """What the driver signs of a batch's step-0 shape (every field but the signature, canonical JSON):
    a member between the driver and another cannot pass on another shape as the driver's, so a lie there
    is named on the member that told it (issue 55)."""
    fields = {k: v for k, v in shape.items() if k != "signature"}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return LinkClaim(task_id, group_id, batch, 0, 1, "shape", hashlib.sha256(text.encode()).hexdigest())
