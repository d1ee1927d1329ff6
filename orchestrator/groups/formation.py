"""Pure group formation: which healthy, ungrouped nodes go together, nearest first.

No I/O here: the scheduler feeds candidates in and persists what comes out, so this is easy to test.
"""

from __future__ import annotations

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
    """Greedy: for each topology in order, seed with the first free node (stable order) and add its
    nearest free neighbours up to max_size; keep the group only if it reaches min_size."""
    free = sorted(candidates, key=lambda c: c.address.lower())
    groups: list[ProposedGroup] = []
    for topology in topologies:
        while True:
            fitting = [c for c in free if topology.fits(c.specs)]
            if len(fitting) < topology.min_size:
                break
            seed = fitting[0]
            others = sorted(fitting[1:], key=lambda c: (distance_km(seed.location, c.location), c.address))
            members = [seed, *others[: topology.max_size - 1]]
            groups.append(ProposedGroup(topology, members))
            taken = {m.address for m in members}
            free = [c for c in free if c.address not in taken]
    return groups


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
