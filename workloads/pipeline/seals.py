"""The end of a batch at one member: its seal (the digest of every frame it sent on its link, signed
with its node key), its successor's check and countersignature, and the bundle that comes back round
the ring, checked for this member's part. Why each step is there: `member.py`'s docstring and
docs/pipeline.md ("What crossed each link, signed")."""

from __future__ import annotations

import hashlib
from collections.abc import Generator
from typing import Any

from workloads.pipeline import inbound
from workloads.pipeline.bundle import GroupBundle
from workloads.pipeline.commit import LinkClaim, LinkRecord, LinkSigner, signed_by
from workloads.pipeline.flight import InFlight, Want
from workloads.pipeline.options import Cheat
from workloads.pipeline.stages import StagePlan
from workloads.pipeline.transport import Frame, MemberLink, MemberMisbehaved


class Sealing:
    """What `Member` does once a batch's frames are all sent: the part of the protocol that commits."""

    signer: LinkSigner | None
    task_id: str
    group_id: str
    address: str
    cheat: Cheat
    plan: StagePlan

    @property
    def _link(self) -> MemberLink:
        raise NotImplementedError

    def _send(self, batch: InFlight, header: dict[str, Any], tensor: Any = None, *, log: bool = True) -> None:
        raise NotImplementedError

    def _claim(self, b: InFlight, sender: int, role: str, sha256: str) -> LinkClaim:
        return LinkClaim(self.task_id, self.group_id, b.number, sender, sender + 1, role, sha256)

    def _seal(self, b: InFlight, links: list[LinkRecord]) -> LinkRecord:
        """After this member's proofs frame: the digest of every frame it sent in the batch, signed, with
        the records of the links before it (for the last member's bundle)."""
        digest = b.sent.digest()
        signature = self.signer.sign(self._claim(b, self.plan.index, "sent", digest)) if self.signer else ""
        self._send(b, {"kind": "seal", "sha256": digest, "signature": signature,
                       "links": [r.header() for r in links]}, log=False)  # fmt: skip
        return LinkRecord(self.plan.index, digest, signature)

    def _countersign(self, b: InFlight, members: list[str]) -> Generator[Want, Frame, list[LinkRecord]]:
        """The predecessor's seal: its digest must be that of the frames received, its signature its node
        key's; countersigned, it joins the records of the links before it."""
        prev = self._link.prev
        frame = yield Want("seal", log=False)
        if frame.header.get("kind") != "seal":
            raise MemberMisbehaved(prev, "a batch without its seal (the digest of what it sent, signed)")
        inbound.seal(prev, frame)
        digest, signature = frame.header.get("sha256"), frame.header.get("signature")
        records = frame.header.get("links")
        try:
            if not isinstance(records, list):
                raise ValueError("no list of link records")
            earlier = [LinkRecord.from_header(r) for r in records]
        except ValueError as exc:
            raise MemberMisbehaved(prev, f"a seal with {exc}") from None
        if not (isinstance(digest, str) and isinstance(signature, str)):
            raise MemberMisbehaved(prev, "a batch without its seal (the digest of what it sent, signed)")
        if len(earlier) != prev or [r.sender for r in earlier] != list(range(prev)):
            raise MemberMisbehaved(prev, f"a seal carrying {len(earlier)} link records at link {prev}")
        got = b.received.digest()
        if self.cheat == "false-accuse" or digest != got:
            raise MemberMisbehaved(prev, f"its seal says it sent {digest[:12]}…, the frames received hash "
                                         f"to {got[:12]}…")  # fmt: skip
        claim = self._claim(b, prev, "sent", digest)
        if self.signer is not None and not signed_by(claim, signature, members[prev]):
            raise MemberMisbehaved(prev, f"its seal is not signed by its node key ({members[prev]})")
        if self.cheat == "forge-received":  # countersigns frames it did not receive
            got = hashlib.sha256(got.encode()).hexdigest()
        counter = self.signer.sign(self._claim(b, prev, "received", got)) if self.signer else ""
        return [*earlier, LinkRecord(prev, digest, signature, got, counter)]

    def _take_bundle(self, b: InFlight, proofs: list[bytes], tokens: list[list[int]] | None,
                     before: list[list[bytes]] | None = None, *, links: list[LinkRecord],
                     seal: LinkRecord, shape: dict[str, Any],
                     lengths: list[int]) -> Generator[Want, Frame, GroupBundle]:  # fmt: skip
        """A non-last member: the batch's bundle, come round the ring from the last member. It must hold
        this member's own proofs (and, at stage 0, its tokens and address) and the earlier stages'
        proofs as they reached it (`before`): otherwise a last member colluding with an earlier liar
        could hand this member a bundle where the liar's proofs look honest, and the replay would
        blame this member for what it was fed. Members before the last but one pass it on."""
        prev = self._link.prev
        frame = yield Want("bundle", log=False)
        if frame.header.get("kind") != "bundle":
            raise MemberMisbehaved(prev, "a batch without its bundle")
        inbound.bundle(prev, frame)
        try:
            bundle = GroupBundle.from_header(frame.header)
        except (KeyError, TypeError, ValueError):
            raise MemberMisbehaved(prev, "a bundle frame that does not parse") from None
        inbound.bundle_fits(prev, bundle, shape, lengths, b.stage.vocab_size)
        index = self.plan.index
        if (len(bundle.stage_proofs) != self.plan.members or bundle.stage_proofs[index] != proofs
                or len(bundle.members) != self.plan.members or bundle.members[index] != self.address
                or (tokens is not None and bundle.outputs != tokens) or bundle.policy != b.policy
                or (before is not None and bundle.stage_proofs[:index] != before)):
            raise MemberMisbehaved(prev, "a bundle that misstates this member's part of the batch")
        mine = bundle.links[index] if len(bundle.links) == self.plan.members - 1 else None
        if (bundle.links[:index] != links or mine is None or mine.sha256 != seal.sha256
                or mine.signature != seal.signature):
            raise MemberMisbehaved(prev, "a bundle that misstates what this member's links carried")
        if self.signer is not None:
            self._records_signed(prev, bundle, b.number)
        if index + 2 < self.plan.members:
            self._send(b, bundle.header(), log=False)
        return bundle

    def _records_signed(self, prev: int, bundle: GroupBundle, batch: int) -> None:
        """Every link record in the bundle is signed by both its ends (whether their digests agree is a
        dispute the validator settles, never this member's to refuse): a record changed on its way round
        the ring is named on whoever handed it on, not on the member after this one."""
        members = bundle.members
        for record in bundle.links:
            where = f"link {record.sender}->{record.receiver}"
            if not 0 <= record.sender < record.receiver < len(members):
                raise MemberMisbehaved(prev, f"a bundle with a record of {where}, not a link of the group")
            sent, received = record.claims(self.task_id, self.group_id, batch)
            signed = (signed_by(sent, record.signature, members[record.sender])
                      and signed_by(received, record.countersignature, members[record.receiver]))  # fmt: skip
            if not signed:
                raise MemberMisbehaved(prev, f"a bundle whose record of {where} its two ends did not sign")

