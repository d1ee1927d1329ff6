"""Pure group formation: which healthy, ungrouped nodes go together: fastest first, nearest among equals.

A group runs at its slowest member's pace (one batch's stages run one after another), so the fastest
free node seeds each group and is joined by nodes of similar proven throughput (within
`SIMILAR_SPEED` of it), nearest first; then by the next fastest; nodes with no proven figure come
last, nearest first (the old rule). Throughput is what the node PROVED: the FLOP/s lower bound of its
latest hardware challenge (a matrix product checked by Freivalds' algorithm, docs/hardware.md), never
the figure its worker reports of itself (`worker/benchmark.py`, shown but not used here): a node can
prove less than it has, never more.

No I/O here: the scheduler feeds candidates in and persists what comes out, so this is easy to test.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from intellect.wire.nodes import ComputeSpecs, Location
from orchestrator.groups.topology import Topology

EARTH_RADIUS_KM = 6371.0


@dataclass(frozen=True)
class Candidate:
    address: str
    specs: ComputeSpecs
    location: Location | None = None
    p2p_address: str | None = None
    throughput: float | None = None  # proven FLOP/s (None: nothing proven)
    reachable: bool = True  # False: behind NAT (the pool could not call it; it fetched its invite)


SIMILAR_SPEED = 0.8  # a node at least this fraction of the seed's throughput counts as equally fast


def _speed(c: Candidate) -> float:
    return c.throughput if c.throughput is not None and c.throughput > 0 else -1.0


def _joining_order(seed: Candidate, c: Candidate) -> tuple[int, float, str]:
    if seed.throughput is None or c.throughput is None:
        return (2, distance_km(seed.location, c.location), c.address)
    if _speed(c) >= SIMILAR_SPEED * _speed(seed):
        return (0, distance_km(seed.location, c.location), c.address)
    return (1, -_speed(c), c.address)


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


def form_groups(candidates: list[Candidate], topologies: list[Topology]) -> list[ProposedGroup]:
    """Greedy: for each topology in order, seed with the fastest free node (address order among equals)
    and add free nodes of similar speed, nearest first, then the next fastest, up to max_size; keep the
    group only if it reaches min_size."""
    free = sorted(candidates, key=lambda c: (-_speed(c), c.address.lower()))
    groups: list[ProposedGroup] = []
    for topology in topologies:
        while True:
            fitting = [c for c in free if topology.fits(c.specs)]
            if len(fitting) < topology.min_size:
                break
            seed = fitting[0]
            others = sorted(fitting[1:], key=lambda c: _joining_order(seed, c))
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
