"""The audit of a group batch: who served which layers and what each member was paid, from the members'
files (their receipts, `intellect.wire.receipts`) and the chain.

Each member of a pipeline group submits its own file of the batch; the file's sha256 is its work key on
chain. Given the files of a batch (any members', any batches'), the audit groups them by the batch their
receipts name, checks that the receipts agree (one member list, one split of the layers, one set of
units and link digests), and joins each member's file with the chain (`Auditor`): who submitted it, the
units it claimed against those the receipt states, the reward it locked, whether it was paid, dropped or
invalidated, and the validators' votes and verdicts. A member whose file was not given, a file the chain
never took, a submitter that is not the member its receipt names, or a claim above the receipt's share
is said as a problem of the batch: nothing paid for a group batch stays unexplained.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, Field

from intellect.wire.receipts import GroupReceipt, read_receipt
from ledger.audit import Audit, AuditedWork, Auditor, Verdict


class MemberAudit(BaseModel):
    stage: int
    node: str
    layers: tuple[int, int]
    units: int = Field(description="what the receipt says the member's file is worth")
    received_sha256: str
    sent_sha256: str
    file: str | None = Field(None, description="the member's file given to the audit (None: not given)")
    work_key: str | None = None
    submitted_by: str | None = Field(None, description="the node that submitted the file on chain")
    units_on_chain: int | None = None
    reward: int | None = Field(None, description="tokens the submission locked (units × reward per unit)")
    status: str = Field("no file", description="no file | not on chain | submitted | paid | dropped | "
                        "invalidated | soft_invalidated")  # fmt: skip
    paid: int = Field(0, description="tokens paid to the member's provider for this file")
    paid_tx: str | None = None
    votes: list[Verdict] = Field(default_factory=list)
    verdicts: list[Verdict] = Field(default_factory=list)


class BatchAudit(BaseModel):
    task_id: str
    group_id: str
    batch: int
    model: str
    model_layers: int
    output_tokens: int
    members: list[MemberAudit]
    paid: int = Field(description="tokens paid for the batch, every member together")
    problems: list[str] = Field(default_factory=list)


class GroupAudit(BaseModel):
    batches: list[BatchAudit]
    notes: list[str] = Field(default_factory=list)


def _agree(receipts: list[tuple[Path, GroupReceipt]]) -> list[str]:
    """What the batch's receipts disagree on (each file states every member; only its own stage differs)."""
    (first_path, first), problems = receipts[0], []
    for path, other in receipts[1:]:
        if other.shared() != first.shared():
            a, b = first.shared().model_dump(), other.shared().model_dump()
            fields = [k for k in a if a[k] != b[k]]
            problems.append(f"{path.name} (stage {other.stage}) and {first_path.name} (stage {first.stage}) "
                            f"state the batch differently: {', '.join(fields)}")  # fmt: skip
    return problems


def _member(receipt: GroupReceipt, stage: int) -> MemberAudit:
    m = receipt.members[stage]
    return MemberAudit(stage=m.stage, node=m.node, layers=m.layers, units=m.units,
                       received_sha256=m.received_sha256, sent_sha256=m.sent_sha256)  # fmt: skip


def _on_chain(member: MemberAudit, work: AuditedWork, problems: list[str]) -> None:
    member.submitted_by, member.units_on_chain, member.reward = work.node, work.units, work.reward
    member.status, member.paid_tx = work.status, work.paid_tx
    member.paid = work.reward if work.status == "paid" else 0
    member.votes, member.verdicts = work.votes, work.verdicts
    if work.node.lower() != member.node.lower():
        problems.append(f"stage {member.stage}: its file was submitted by {work.node}, the receipt names "
                        f"{member.node}")  # fmt: skip
    if work.units > member.units:
        problems.append(f"stage {member.stage}: {work.units} units claimed on chain, the receipt states "
                        f"{member.units}")  # fmt: skip


class GroupAuditor:
    """Reads the members' files and asks the chain (one `Auditor` audit per submitting node)."""

    def __init__(self, auditor: Auditor) -> None:
        self.auditor = auditor
        self._audits: dict[str, Audit] = {}

    def _work(self, work_key: str) -> AuditedWork | None:
        node = self.auditor.submitter(work_key)
        if node is None:
            return None
        if node not in self._audits:
            self._audits[node] = self.auditor.node(node)
        audit = self._audits[node]
        return next((w for w in [*audit.unpaid, *(w for p in audit.payouts for w in p.work)]
                     if w.work_key == work_key), None)  # fmt: skip

    def audit(self, paths: Iterable[Path]) -> GroupAudit:
        """Raises `ReceiptError` for a file without a readable receipt (the caller names it)."""
        batches: dict[tuple[str, str, int, tuple[str, ...]], list[tuple[Path, GroupReceipt, str]]] = {}
        seen: set[str] = set()
        for path in paths:
            receipt, sha = read_receipt(Path(path))
            if sha in seen:
                continue  # the same file given twice
            seen.add(sha)
            batches.setdefault(receipt.batch_key(), []).append((Path(path), receipt, sha))
        out = []
        for files in batches.values():
            first = files[0][1]
            problems = _agree([(p, r) for p, r, _ in files])
            members = [_member(first, stage) for stage in range(len(first.members))]
            for path, receipt, sha in files:
                member = members[receipt.stage]
                if member.file is not None:
                    problems.append(f"stage {receipt.stage}: two files, {Path(member.file).name} and "
                                    f"{path.name}")  # fmt: skip
                    continue
                member.file, member.work_key = str(path), "0x" + sha
                work = self._work(member.work_key)
                if work is None:
                    member.status = "not on chain"
                    problems.append(f"stage {receipt.stage}: {path.name} (work key 0x{sha[:12]}…) was never "
                                    "submitted on this chain")  # fmt: skip
                else:
                    _on_chain(member, work, problems)
            problems += [f"stage {m.stage} ({m.node}): no file given" for m in members if m.file is None]
            out.append(BatchAudit(task_id=first.task_id, group_id=first.group_id, batch=first.batch,
                                  model=first.model, model_layers=first.model_layers,
                                  output_tokens=first.output_tokens, members=members,
                                  paid=sum(m.paid for m in members), problems=problems))  # fmt: skip
        out.sort(key=lambda b: (b.task_id, b.group_id, b.batch))
        notes = sorted({n for a in self._audits.values() for n in a.notes})
        return GroupAudit(batches=out, notes=notes)
