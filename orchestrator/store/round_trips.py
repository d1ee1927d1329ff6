"""Measured round trips between nodes (`round_trips`): the round-trip loop (orchestrator/hardware/
round_trips.py) records what each node measured to others' peer inboxes through `RoundTripBook`, its
only writer; group formation reads `reports` (and judges them: orchestrator/groups/nearness.py),
the API shows `links`.

Why both ends, at the larger figure: a node reports its own measurement, so it could report a short
round trip to a node it wants to sit next to. The kernel of the measured node answers a TCP handshake,
so an honest end's figure is never shorter than the network allows; `links` (what the API shows)
pairs both ends' figures at the larger. Making its other links look slower is the other lie (issue
56): placement therefore reads the raw `reports` and trusts only links whose ends agree, none of a
node that contradicts its peers (orchestrator/groups/nearness.py). What this cannot tell apart: a
peer inbox that is a relay near the victim (the handshake is the relay's); docs/hardware.md.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.models import RoundTripRow, utcnow

FRESH = timedelta(hours=6)  # older figures are not used (a node may have moved)


def links(session: Session, addresses: Collection[str] | None = None) -> dict[frozenset[str], float]:
    """Each pair measured from both ends within `FRESH`: the larger figure, in ms (a pair one end could
    not reach is left out: no figure, as if unmeasured)."""
    query = select(RoundTripRow).where(RoundTripRow.at >= utcnow() - FRESH, RoundTripRow.ms.is_not(None))
    if addresses is not None:
        query = query.where(RoundTripRow.reporter.in_(list(addresses)))
    seen: dict[tuple[str, str], float] = {(r.reporter, r.target): float(r.ms or 0.0)
                                          for r in session.scalars(query)}  # fmt: skip
    pairs: dict[frozenset[str], float] = {}
    for (a, b), ms in seen.items():
        other = seen.get((b, a))
        if other is not None and a != b:
            pairs[frozenset((a, b))] = max(ms, other)
    return pairs


def reports(session: Session,
            addresses: Collection[str] | None = None) -> dict[tuple[str, str], float | None]:  # fmt: skip
    """Every fresh report among `addresses` (both ends in it), (reporter, target) → ms, None: not
    reached. What placement judges (orchestrator/groups/nearness.py): which links agree, which nodes'
    reports contradict their peers'."""
    query = select(RoundTripRow).where(RoundTripRow.at >= utcnow() - FRESH)
    if addresses is not None:
        wanted = list(addresses)
        query = query.where(RoundTripRow.reporter.in_(wanted), RoundTripRow.target.in_(wanted))
    return {(r.reporter, r.target): r.ms for r in session.scalars(query)}


class RoundTripBook:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def record(self, reporter: str, measured: dict[str, float | None]) -> None:
        """`reporter`'s latest figure to each target (replacing its earlier one); its figures older than
        `FRESH` go (no longer used: a reporter keeps at most what it measures in `FRESH`)."""
        if not measured:
            return
        now = utcnow()
        with self.sessions() as session, session.begin():
            session.execute(delete(RoundTripRow).where(RoundTripRow.reporter == reporter,
                                                       RoundTripRow.target.in_(list(measured))))  # fmt: skip
            session.execute(delete(RoundTripRow).where(RoundTripRow.reporter == reporter,
                                                       RoundTripRow.at < now - FRESH))  # fmt: skip
            session.add_all(RoundTripRow(reporter=reporter, target=target, ms=ms, at=now)
                            for target, ms in measured.items())  # fmt: skip

    def measured_at(self) -> dict[str, dict[str, float]]:
        """When each reporter last measured each target (epoch seconds), in one query per pass: the
        loop measures the oldest first."""
        seen: dict[str, dict[str, float]] = {}
        with self.sessions() as session:
            for reporter, target, at in session.execute(
                    select(RoundTripRow.reporter, RoundTripRow.target, RoundTripRow.at)):
                seen.setdefault(reporter, {})[target] = at.timestamp()
        return seen

    def links(self, addresses: Collection[str] | None = None) -> dict[frozenset[str], float]:
        with self.sessions() as session:
            return links(session, addresses)

    def of(self, address: str) -> dict[str, float]:
        """The node's links (both ends measured), by the other end."""
        with self.sessions() as session:
            peers = list(session.scalars(select(RoundTripRow.target).where(RoundTripRow.reporter == address)))
            pairs = links(session, [address, *peers])
        return {next(iter(pair - {address})): ms for pair, ms in pairs.items() if address in pair}
