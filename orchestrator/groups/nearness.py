"""Which measured links placement may trust, from what both ends of each reported (pure; issue 56).

Each node reports its own round trips to others' peer inboxes (orchestrator/hardware/round_trips.py).
A round trip is the same two one-way paths seen from either end, so two honest ends agree on it, up
to timing noise. A node's report is its own word, and a node that wants to sit next to a chosen
victim could report every other link as unreachable or slow: if those links were then dropped (or
counted at the liar's figure) and the victim's link kept, the victim would be the liar's only near
neighbour. So:

- a link counts as measured only when both ends reported a figure and the figures agree (the larger
  no more than `AGREE_FACTOR` × the smaller + `AGREE_SLACK_MS`), at the larger figure: nobody makes
  a link look faster than its other end saw it;
- a node whose own report contradicts a peer that measured it is **disputed**: it reported the peer
  unreachable (the peer reached it), or the two figures disagree (then both ends are disputed: one
  link does not tell the liar from its partner, and a node that reports a link short to be placed
  near a peer disputes itself as well). None of a disputed node's links counts as measured, for any
  seed: all of them are placed by the orchestrator's own round trips (orchestrator/groups/
  formation.py), so its reports cannot single out the one link it left standing, and every other
  node sees it the same way (had the victim alone kept its measured link to the liar while the others
  saw the liar at its bound, the others would leave the liar to the victim). Lying about its links
  costs the liar the measured placement it would have had, and can cost a partner of a disagreeing
  link the same, never a place: the bounds are the orchestrator's own;
- a link that is not measured (one end did not report it, could not reach it, or the ends disagree)
  is bounded by the sum of the orchestrator's round trips to both ends in formation, not dropped.

A node the pool could not call (it joined by fetching its invite: behind NAT) cannot be reached by
anyone: a null reported for it is the truth, not a dispute.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

# Two honest ends of one link measure the same round trip (the shortest of three handshakes each):
# they differ by timing noise, well under this. The most a liar can stretch a link without a dispute.
AGREE_FACTOR = 1.25
AGREE_SLACK_MS = 2.0

Reports = Mapping[tuple[str, str], float | None]  # (reporter, target) → ms; None: not reached


def agree(a: float, b: float) -> bool:
    return max(a, b) <= AGREE_FACTOR * min(a, b) + AGREE_SLACK_MS


def agreed_links(reports: Reports) -> dict[frozenset[str], float]:
    """The pairs both ends measured with figures that agree, at the larger figure (ms)."""
    links: dict[frozenset[str], float] = {}
    for (a, b), ms in reports.items():
        other = reports.get((b, a))
        if a != b and ms is not None and other is not None and agree(ms, other):
            links[frozenset((a, b))] = max(ms, other)
    return links


def disputed_nodes(reports: Reports, unreachable: Collection[str] = ()) -> set[str]:
    """The nodes whose report on a peer contradicts that peer's own figure for the link: null for a
    peer that reached them (unless nobody can reach that peer), or a figure the two do not agree on
    (both ends)."""
    cannot_be_called = set(unreachable)
    disputed: set[str] = set()
    for (reporter, target), ms in reports.items():
        theirs = reports.get((target, reporter))
        if reporter == target or theirs is None:
            continue
        if ms is None and target not in cannot_be_called:
            disputed.add(reporter)
        elif ms is not None and not agree(ms, theirs):
            disputed.update((reporter, target))
    return disputed


Trusted = tuple[dict[frozenset[str], float], set[str]]


def trusted_links(reports: Reports, unreachable: Collection[str] = ()) -> Trusted:
    """What placement goes by: the agreed links with no disputed end, and the disputed nodes."""
    disputed = disputed_nodes(reports, unreachable)
    links = {pair: ms for pair, ms in agreed_links(reports).items() if not pair & disputed}
    return links, disputed
