"""Pure group formation: a node drawn among the fastest free ones seeds a group, nodes of similar
measured speed join it nearest first, slower ones after; nodes that reported no figure come last
(nearest first, as before). Without a draw, the seed is the first of the band by address."""

from __future__ import annotations

from intellect.wire.nodes import ComputeSpecs, Location
from orchestrator.groups.formation import Candidate, form_groups, ring_order
from orchestrator.groups.topology import parse_topology_name

SPECS = ComputeSpecs(cpu_cores=4, ram_mb=8000, disk_free_mb=10_000)
BERLIN, PARIS, TOKYO = Location(latitude=52.5, longitude=13.4), Location(latitude=48.9, longitude=2.35), \
    Location(latitude=35.7, longitude=139.7)  # fmt: skip


def node(name: str, speed: float | None, where: Location | None = None) -> Candidate:
    return Candidate(address=name, specs=SPECS, location=where, throughput=speed)


def members(groups) -> list[list[str]]:  # noqa: ANN001
    return [[m.address for m in g.members] for g in groups]


def test_the_fastest_nodes_are_grouped_together() -> None:
    nodes = [node("a", 100), node("b", 900), node("c", 120), node("d", 1000)]
    # b is within 80 % of d: the two are one band, whose seed is drawn (address order without a draw)
    assert members(form_groups(nodes, [parse_topology_name("2x0GB")])) == [["b", "d"], ["a", "c"]]


def test_among_equally_fast_nodes_the_nearest_joins_first() -> None:
    nodes = [node("a-seed", 1000, BERLIN), node("tokyo", 990, TOKYO), node("paris", 850, PARIS),
             node("slow-paris", 300, PARIS)]  # fmt: skip
    # paris is within 80 % of the seed's speed and nearer than tokyo: it joins first.
    assert members(form_groups(nodes, [parse_topology_name("2x0GB")]))[0] == ["a-seed", "paris"]
    three = form_groups(nodes, [parse_topology_name("3x0GB")])
    assert members(three) == [["a-seed", "paris", "tokyo"]]  # the slow one is left for a slower group


def test_nodes_without_a_figure_come_after_measured_ones_and_keep_the_nearest_rule() -> None:
    nodes = [node("x", None, TOKYO), node("y", None, PARIS), node("z", None, BERLIN), node("m", 10)]
    groups = members(form_groups(nodes, [parse_topology_name("2x0GB")]))
    assert groups[0][0] == "m"  # measured first, even when slow
    unmeasured = form_groups([n for n in nodes if n.throughput is None], [parse_topology_name("2x0GB")])
    assert members(unmeasured) == [["x", "z"]]  # x seeds (address order); Berlin is nearer Tokyo than Paris


def nat(name: str, speed: float | None = None) -> Candidate:
    return Candidate(address=name, specs=SPECS, throughput=speed, reachable=False)


def test_no_two_members_behind_nat_are_neighbours_in_the_ring() -> None:
    # each link of the ring needs one end that can be called: at most half the members behind NAT,
    # and they alternate with reachable ones
    nodes = [nat("n1", 1000), nat("n2", 990), nat("n3", 980), node("r1", 500), node("r2", 400)]
    groups = members(form_groups(nodes, [parse_topology_name("4x0GB")]))
    assert [sorted(g) for g in groups] == [["n1", "n2", "r1", "r2"]]  # n3 passed over
    pairs = members(form_groups(nodes, [parse_topology_name("2x0GB")]))
    assert [sorted(g) for g in pairs] == [["n1", "r1"], ["n2", "r2"]]  # n3: no reachable partner left
    for draw in ("a", "b", "c", "d"):
        ring = [m.address for m in ring_order(form_groups(nodes, [parse_topology_name("4x0GB")])[0].members,
                                              draw)]  # fmt: skip
        assert all(not (ring[i][0] == ring[(i + 1) % 4][0] == "n") for i in range(4)), ring
    assert form_groups([nat("a"), nat("b")], [parse_topology_name("2x0GB")]) == []
    alone = form_groups([nat("a")], [parse_topology_name("1x0GB")])
    assert members(alone) == [["a"]]  # a group of one has no link


def test_ring_order_alternates_and_leaves_an_all_reachable_ring_alone() -> None:
    given = [nat("n1"), nat("n2"), node("r1", 1), node("r2", 1), node("r3", 1)]
    order = [m.address for m in ring_order(given)]
    assert order == ["r1", "n1", "r2", "n2", "r3"]
    plain = [node("a", 1), node("b", 1), node("c", 1)]
    assert ring_order(plain) == plain
    for i in range(len(order)):  # cyclically: no NAT-ed neighbours, the last and the first included
        assert not (order[i].startswith("n") and order[(i + 1) % len(order)].startswith("n"))


def test_the_ring_order_is_drawn_and_no_claim_places_a_member_before_another() -> None:
    """Issue 36: the stage order comes from the group's id (the orchestrator's randomness, made after the
    members are picked), not from what members claim: the fastest, nearest claimant is not stage 0,
    and over draws every member precedes every other one."""
    plain = [node("liar", 10_000, PARIS), node("victim", 100, PARIS), node("c", 100, TOKYO)]
    before: dict[str, set[str]] = {m.address: set() for m in plain}
    firsts = set()
    for i in range(64):
        ring = [m.address for m in ring_order(plain, f"group-{i}")]
        assert sorted(ring) == sorted(m.address for m in plain)
        assert ring == [m.address for m in ring_order(list(reversed(plain)), f"group-{i}")]  # draw alone
        firsts.add(ring[0])
        for j, m in enumerate(ring):
            before[m].add(ring[(j + 1) % len(ring)])
    assert firsts == {"liar", "victim", "c"}
    assert all(len(after) == 2 for after in before.values())  # each one's successor varies with the draw


def test_measured_links_and_the_orchestrators_round_trips_are_one_scale_before_declared_places() -> None:
    seed = Candidate(address="a-seed", specs=SPECS, location=BERLIN, throughput=1100, rtt_ms=5.0)
    paris = Candidate(address="paris", specs=SPECS, location=PARIS, throughput=1000, rtt_ms=40.0)
    tokyo = Candidate(address="tokyo", specs=SPECS, location=TOKYO, throughput=1000, rtt_ms=1.0)
    two = [parse_topology_name("2x0GB")]
    # no pair measured: the orchestrator's round trips (5 + 1 < 5 + 40) beat the declared places
    assert members(form_groups([seed, paris, tokyo], two))[0] == ["a-seed", "tokyo"]
    # Paris–seed measured by both ends at 3 ms: nearer than Tokyo's bound of 6 ms
    assert members(form_groups([seed, paris, tokyo], two, {frozenset(("a-seed", "paris")): 3.0}))[0] == \
        ["a-seed", "paris"]  # fmt: skip
    # ... but a measured link is no better than an unmeasured one bounded lower (issue 56): the one link
    # a node left measured does not win over those it refused to measure
    assert members(form_groups([seed, paris, tokyo], two, {frozenset(("a-seed", "paris")): 30.0}))[0] == \
        ["a-seed", "tokyo"]  # fmt: skip
    # without any round trip, the declared places as before
    bare = [node("a-seed", 1100, BERLIN), node("tokyo", 1000, TOKYO), node("paris", 1000, PARIS)]
    assert members(form_groups(bare, two))[0] == ["a-seed", "paris"]


def test_ties_are_broken_by_the_draw_not_by_the_address_a_node_picks() -> None:
    equal = [node(f"n{i}", 1000) for i in range(6)]
    seeds = {members(form_groups(equal, [parse_topology_name("2x0GB")], draw=d))[0][0] for d in "abcdefgh"}
    assert len(seeds) > 1  # over draws, different nodes seed: nobody wins by picking a low address
