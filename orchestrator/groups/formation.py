"""Pure group formation: which healthy, ungrouped nodes go together: equally fast nodes, near ones.

A group runs at its slowest member's pace (one batch's stages run one after another). The fastest
free node's proven throughput sets a band (`SIMILAR_SPEED` of it); the seed is drawn among the nodes
in that band and joined by nodes of similar proven throughput, near ones first; then by the next
fastest; nodes with no proven figure come last. Throughput is what the node PROVED: the FLOP/s lower
bound of its latest hardware challenge (docs/hardware.md), never the figure its worker reports of
itself. A node can prove less than it has at will, not more by delaying the challenger's probes (the
time is taken around the exchange itself), and more without bound only through a faster machine
answering for it (a relay), which no time bound tells apart. Drawing the seed within the band means
proving a figure a little above the others buys nothing: issue 56 found a node that proved 1.01× its
peers seeding every group it was in.

"Near" is measured, not declared, and no node's own reports can single out a neighbour
(orchestrator/groups/nearness.py): a link counts when both ends measured it and agree; a link not
measured is bounded by the sum of the orchestrator's own round trips to each end (the triangle
inequality), never dropped; a node whose reports contradict its peers' has none of its links
counted (the caller leaves them out of `links`); the location a node reports of itself only where
no round trip exists (a pool that challenges no hardware). Candidates within `NEAR_FACTOR` of the
seed's nearest are equally near, in the draw's order: a round trip's few ms of noise, or a liar's
`AGREE_FACTOR` of slack, choose nobody. The draw (a fresh random value per pass, sha256 with each
address) is one nobody can predict or grind.

No I/O here: the scheduler feeds candidates in and persists what comes out, so this is easy to test.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from intellect.wire.nodes import ComputeSpecs, Location
from orchestrator.groups.nearness import AGREE_FACTOR
from orchestrator.groups.topology import Topology

EARTH_RADIUS_KM = 6371.0


@dataclass(frozen=True)
class Candidate:
    address: str
    specs: ComputeSpecs
    location: Location | None = None
    p2p_address: str | None = None
    throughput: float | None = None  # proven FLOP/s (None: nothing proven)
    rtt_ms: float | None = None  # the orchestrator's measured round trip to it (with its proof)
    reachable: bool = True  # False: behind NAT (the pool could not call it; it fetched its invite)


SIMILAR_SPEED = 0.8  # a node at least this fraction of the seed's throughput counts as equally fast
# Candidates within this factor (+ slack) of the seed's nearest count as equally near and are taken in
# the draw's order. Above AGREE_FACTOR, so the most an undisputed liar can stretch a link (to
# AGREE_FACTOR × what its other end saw) does not push an equally near peer out of the band.
# Honest links within NEAR_FACTOR / AGREE_FACTOR (1.6×) of the nearest stay in the band however a liar
# stretches them.
NEAR_FACTOR = 2.0
NEAR_SLACK_MS = 2.0
assert NEAR_FACTOR > AGREE_FACTOR


def _speed(c: Candidate) -> float:
    return c.throughput if c.throughput is not None and c.throughput > 0 else -1.0


Links = Mapping[frozenset[str], float]


def nearness(seed: Candidate, c: Candidate, links: Links) -> tuple[int, float]:
    """How near `c` is to `seed`, smaller first: (0, ms) by the link both ends measured and agree on,
    else by the sum of the orchestrator's round trips to both (an upper bound on the link); (1, km
    between declared locations) only where neither exists."""
    measured = links.get(frozenset((seed.address, c.address)))
    if measured is not None:
        return (0, measured)
    if seed.rtt_ms is not None and c.rtt_ms is not None:
        return (0, seed.rtt_ms + c.rtt_ms)
    return (1, distance_km(seed.location, c.location))


def _tie(c: Candidate, draw: str | None) -> str:
    if draw is None:
        return c.address
    return hashlib.sha256(f"intellect-formation:{draw}:{c.address.lower()}".encode()).hexdigest()


def _near_order(seed: Candidate, others: list[Candidate], links: Links,
                draw: str | None) -> dict[str, tuple[int, int, float, str]]:  # fmt: skip
    """Each candidate's place by nearness to `seed`: those within NEAR_FACTOR of the nearest first, in
    the draw's order; the rest by how near."""
    near = {c.address: nearness(seed, c, links) for c in others}
    best = min(near.values(), default=(0, 0.0))
    order: dict[str, tuple[int, int, float, str]] = {}
    for c in others:
        tier, value = near[c.address]
        # declared places (tier 1) are the node's own word either way: ordered as given
        equal = tier == best[0] == 0 and value <= NEAR_FACTOR * best[1] + NEAR_SLACK_MS
        order[c.address] = (tier, 0, 0.0, _tie(c, draw)) if equal else (tier, 1, value, _tie(c, draw))
    return order


def _kind(seed: Candidate, c: Candidate) -> int:
    """0: as fast as the seed (joins by nearness); 1: slower (joins by speed); 2: unproven, or the seed is."""
    if seed.throughput is None or c.throughput is None:
        return 2
    return 0 if _speed(c) >= SIMILAR_SPEED * _speed(seed) else 1


def _joining(seed: Candidate, rest: list[Candidate], links: Links, draw: str | None) -> list[Candidate]:
    """`rest` in the order it joins `seed`: the equally fast by nearness, then the slower by speed,
    then the unproven by nearness (nearness compared within each kind)."""
    kinds = {c.address: _kind(seed, c) for c in rest}
    near: dict[str, tuple[int, int, float, str]] = {}
    for kind in (0, 2):
        near.update(_near_order(seed, [c for c in rest if kinds[c.address] == kind], links, draw))

    def key(c: Candidate) -> tuple[int, tuple[int, int, float, str] | float, str]:
        kind = kinds[c.address]
        return (kind, -_speed(c) if kind == 1 else near[c.address], _tie(c, draw))

    return sorted(rest, key=key)


def _drawn_seed(fitting: list[Candidate], draw: str | None) -> Candidate:
    """The seed: drawn among the free nodes within SIMILAR_SPEED of the fastest (all unproven ones
    when none proved anything), so a figure slightly above the others does not make a node the seed."""
    top = _speed(fitting[0])
    band = [c for c in fitting if (_speed(c) >= SIMILAR_SPEED * top if top > 0 else _speed(c) == top)]
    return min(band, key=lambda c: _tie(c, draw))


@dataclass
class ProposedGroup:
    topology: Topology
    members: list[Candidate] = field(default_factory=list)


def distance_km(a: Location | None, b: Location | None) -> float:
    """Great-circle distance; unknown locations sort after every known one."""
    if a is None or b is None:
        return math.inf
    lat1, lon1, lat2, lon2 = map(math.radians, (a.latitude, a.longitude, b.latitude, b.longitude))
    h = math.sin((lat2 - lat1) / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


def form_groups(candidates: list[Candidate], topologies: list[Topology], links: Links | None = None,
                draw: str | None = None) -> list[ProposedGroup]:  # fmt: skip
    """Greedy: for each topology in order, seed with a node drawn among the fastest free ones (the
    draw's order; address order without one) and add free nodes of similar speed, near ones first
    (`links`: measured round trips by pair, those formation may trust: nearness.py), then
    the next fastest, up to max_size; keep the group only if it reaches min_size."""
    measured: Links = links or {}
    free = sorted(candidates, key=lambda c: (-_speed(c), _tie(c, draw).lower()))
    groups: list[ProposedGroup] = []
    for topology in topologies:
        while True:
            fitting = [c for c in free if topology.fits(c.specs)]
            if len(fitting) < topology.min_size:
                break
            seed = _drawn_seed(fitting, draw)
            rest = [c for c in fitting if c.address != seed.address]
            others = _joining(seed, rest, measured, draw)
            members = _callable_ring([seed, *others], topology.max_size)
            if len(members) < topology.min_size:  # the seed is behind NAT and too few can be called
                free = [c for c in free if c.address != seed.address]
                continue
            groups.append(ProposedGroup(topology, members))  # ring order: drawn when it is created
            taken = {m.address for m in members}
            free = [c for c in free if c.address not in taken]
    return groups


def _callable_ring(ordered: list[Candidate], size: int) -> list[Candidate]:
    """The first `size` of `ordered` (the seed first), passing over nodes behind NAT beyond what a ring
    can carry: each link needs one end that can be called, so at most half the members may sit behind
    NAT (a group of one has no link: any node may form it)."""
    members: list[Candidate] = []
    for c in ordered:
        if len(members) == size:
            break
        members.append(c)
    if size == 1 or len(members) <= 1:
        return members[:1]
    while sum(not m.reachable for m in members) * 2 > len(members):
        # too many behind NAT: swap the last of them for the next reachable node not yet taken
        spare = next((c for c in ordered if c.reachable and c not in members), None)
        last_nat = max(i for i, m in enumerate(members) if not m.reachable)
        members.pop(last_nat)
        if spare is not None:
            members.append(spare)
    return members


def ring_order(members: list[Candidate], draw: str | None = None) -> list[Candidate]:
    """The members in ring order with no two behind NAT next to each other (nobody could open the link
    between them): reachable and NAT-ed members alternate while both last, reachable ones fill the
    rest. A ring that cannot avoid it (more than half behind NAT) keeps the drawn order.

    `draw` (the group's id: a UUID4 from the orchestrator's CSPRNG, made after the members were picked)
    shuffles the members first, so nobody in the group chooses its stage or its neighbours by what it
    claims (a throughput, a location): a member that could place itself right before a chosen victim
    would decide whose input it forwards (issue 36). Without `draw`, the given order within each kind
    (tests of the NAT rule)."""
    if draw is not None:
        members = drawn_order(members, draw)
    callable_, behind = [m for m in members if m.reachable], [m for m in members if not m.reachable]
    if not behind or len(behind) > len(callable_):
        return members
    ring: list[Candidate] = []
    for i, m in enumerate(callable_):
        ring.append(m)
        if i < len(behind):
            ring.append(behind[i])
    return ring


def drawn_order(members: list[Candidate], draw: str) -> list[Candidate]:
    """The members sorted by sha256(draw, address): a permutation fixed by `draw` alone."""
    def key(c: Candidate) -> str:
        return hashlib.sha256(f"intellect-ring-order:{draw}:{c.address.lower()}".encode()).hexdigest()

    return sorted(members, key=key)


def merge_candidates(sizes: dict[str, int], topology: Topology) -> list[tuple[str, str]]:
    """Pairs of idle groups (id → size) of one topology that fit together within max_size,
    smallest first, each group in at most one pair."""
    small = sorted((size, gid) for gid, size in sizes.items() if size < topology.max_size)
    pairs: list[tuple[str, str]] = []
    used: set[str] = set()
    for i, (size_a, a) in enumerate(small):
        if a in used:
            continue
        for size_b, b in small[i + 1 :]:
            if b not in used and size_a + size_b <= topology.max_size:
                pairs.append((a, b))
                used.update((a, b))
                break
    return pairs
