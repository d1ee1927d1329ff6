"""Hardware proofs (`hardware_proofs`): the challenger (orchestrator/hardware/) records each challenge
through `HardwareBook`, its only writer; placement, `/nodes` and the CLI read the latest per node."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.models import HardwareProofRow, utcnow

PROVEN, WRONG, UNANSWERED = "proven", "wrong", "unanswered"
# Committed (signed) and then did not open, opened late, or opened something else: a failure like WRONG
# for the invite and placement; its evidence takes no stake (docs/hardware.md says why).
UNOPENED = "unopened"
FAILED = (WRONG, UNOPENED)
# A node with this many failed challenges on record is not invited again and not grouped: the bound on
# how often a liar may try its luck (each try of a 90 %-rows liar fails 99.9 % of the time).
MAX_FAILED = 3


@dataclass(frozen=True)
class ProofRecord:
    node_address: str
    outcome: str
    n: int
    precision: str
    flops: float | None = None
    rtt_ms: float | None = None
    seconds: float | None = None
    reasons: tuple[str, ...] = ()
    evidence: dict[str, Any] | None = None
    at: datetime | None = None


def _record(row: HardwareProofRow) -> ProofRecord:
    return ProofRecord(node_address=row.node_address, outcome=row.outcome, n=row.n, precision=row.precision,
                       flops=row.flops, rtt_ms=row.rtt_ms, seconds=row.seconds,
                       reasons=tuple(row.reasons or ()), evidence=row.evidence, at=row.at)  # fmt: skip


def latest_proofs(session: Session, addresses: Collection[str] | None = None) -> dict[str, ProofRecord]:
    """Each node's latest challenge (any outcome), by address."""
    newest = select(HardwareProofRow.node_address, func.max(HardwareProofRow.id).label("id"))
    if addresses is not None:
        newest = newest.where(HardwareProofRow.node_address.in_(list(addresses)))
    ids = [row.id for row in session.execute(newest.group_by(HardwareProofRow.node_address))]
    if not ids:
        return {}
    rows = session.scalars(select(HardwareProofRow).where(HardwareProofRow.id.in_(ids)))
    return {row.node_address: _record(row) for row in rows}


def proven_flops(session: Session) -> dict[str, float]:
    """What placement goes by: each node's proven FLOP/s from its latest challenge, where that proved
    something (a node whose latest answer was wrong or missing has no figure)."""
    return {address: p.flops for address, p in latest_proofs(session).items()
            if p.outcome == PROVEN and p.flops is not None}  # fmt: skip


def failed_counts(session: Session, addresses: Collection[str] | None = None) -> dict[str, int]:
    """Each node's failed challenges on record (wrong or unopened), by address; nodes with none absent."""
    query = select(HardwareProofRow.node_address, func.count()).where(HardwareProofRow.outcome.in_(FAILED))
    if addresses is not None:
        query = query.where(HardwareProofRow.node_address.in_(list(addresses)))
    return {a: int(c) for a, c in session.execute(query.group_by(HardwareProofRow.node_address))}


class HardwareBook:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def record(self, proof: ProofRecord) -> None:
        with self.sessions() as session, session.begin():
            session.add(HardwareProofRow(
                node_address=proof.node_address, at=proof.at or utcnow(), n=proof.n,
                precision=proof.precision,
                outcome=proof.outcome, flops=proof.flops, rtt_ms=proof.rtt_ms, seconds=proof.seconds,
                reasons=list(proof.reasons) or None, evidence=proof.evidence,
            ))  # fmt: skip

    def latest(self, addresses: Collection[str] | None = None) -> dict[str, ProofRecord]:
        with self.sessions() as session:
            return latest_proofs(session, addresses)

    def failed(self, address: str) -> int:
        with self.sessions() as session:
            return failed_counts(session, [address]).get(address, 0)

    def history(self, address: str, limit: int = 20) -> list[ProofRecord]:
        with self.sessions() as session:
            rows = session.scalars(select(HardwareProofRow).where(HardwareProofRow.node_address == address)
                                   .order_by(HardwareProofRow.id.desc()).limit(limit))  # fmt: skip
            return [_record(r) for r in rows]
