"""Issue 56: a node cannot choose whom it is grouped with. Eight equal nodes, one of them an attacker
that wants to sit with a chosen victim: it proves 1.01× the others' figure, reports every link but the
victim's as unreachable or slow (or stretched as far as the two ends still agree), and delays the
orchestrator's round-trip probes. Over 200 formations, each with its own draw (fixed here, so the test
is deterministic; the orchestrator draws uuid4), it is grouped with the victim no more often than when
it plays honestly, within noise. The figures go through what the orchestrator runs: the proofs and
round trips recorded in SQL, `placement_links` (the reconcile's own) and `form_groups`."""

from __future__ import annotations

import math
import random

import pytest

from intellect.identity import Wallet
from orchestrator.groups.formation import form_groups
from orchestrator.groups.nearness import AGREE_FACTOR, AGREE_SLACK_MS
from orchestrator.groups.reconcile import candidate, placement_links
from orchestrator.groups.topology import parse_topology_name
from orchestrator.models import NodeRow
from orchestrator.store.hardware import PROVEN, HardwareBook, ProofRecord, latest_proofs
from orchestrator.store.round_trips import RoundTripBook
from tests.groups.test_groups_reconcile import add_node, sessions

FORMATIONS = 200
NODES = 8
SPEED = 5e11


def honest(true_ms: float, rng: random.Random) -> float:
    return round(true_ms * rng.uniform(1.0, 1.04), 3)  # the shortest of 3 handshakes: a little above


def attack(kind: str, theirs: float) -> float | None:
    if kind == "null":
        return None
    if kind == "slow":
        return 900.0
    return AGREE_FACTOR * theirs + AGREE_SLACK_MS - 0.01  # "stretch": as slow as the two still agree


def pool(tmp_path, kind: str | None):  # noqa: ANN201
    """Eight nodes on one LAN-ish network (links 8-12 ms, 15-25 ms to the orchestrator); node 0 attacks
    node 1 (`kind`: None plays honestly). Returns the session factory, attacker and victim."""
    rng = random.Random(56)
    tmp_path.mkdir(parents=True, exist_ok=True)
    make = sessions(tmp_path)
    with make() as s, s.begin():
        nodes = [add_node(s, None, 80_000, port=9000 + i) for i in range(NODES)]
        for i, address in enumerate(nodes):  # fixed addresses: the draws' order is then fixed too
            s.get(NodeRow, address).address = nodes[i] = f"0x{i + 1:040x}"
    attacker, victim = nodes[0], nodes[1]
    true = {frozenset((a, b)): rng.uniform(8.0, 12.0) for i, a in enumerate(nodes) for b in nodes[i + 1:]}
    hardware = HardwareBook(make)
    for address in nodes:
        speed = SPEED * rng.uniform(0.97, 1.0)
        rtt = rng.uniform(15.0, 25.0)
        if kind is not None and address == attacker:
            speed, rtt = SPEED * 1.01, rtt + 200.0  # just above everyone; its probes delayed
        hardware.record(ProofRecord(node_address=address, outcome=PROVEN, n=1024, precision="float32",
                                    flops=speed, rtt_ms=rtt))  # fmt: skip
    said = {(a, b): honest(true[frozenset((a, b))], rng) for a in nodes for b in nodes if a != b}
    if kind is not None:
        for b in nodes[1:]:
            if b != victim:
                said[(attacker, b)] = attack(kind, said[(b, attacker)] or 0.0)
    book = RoundTripBook(make)
    for a in nodes:
        book.record(a, {b: ms for (r, b), ms in said.items() if r == a})
    return make, attacker, victim


def together_count(make, attacker: str, victim: str, size: int) -> int:  # noqa: ANN001
    topology = parse_topology_name(f"{size}x64GB")
    with make() as s:
        latest = latest_proofs(s)
        proven = {a: p.flops for a, p in latest.items() if p.flops is not None}
        rtt = {a: p.rtt_ms for a, p in latest.items() if p.rtt_ms is not None}
        free = [candidate(row, proven, rtt) for row in s.query(NodeRow).all()]
        measured, _ = placement_links(s, free)
    count = 0
    for i in range(FORMATIONS):
        for group in form_groups(free, [topology], measured, draw=f"{i:032x}"):
            names = {m.address for m in group.members}
            count += attacker in names and victim in names
    return count


@pytest.mark.parametrize("size", [2, 4])
def test_an_attacker_is_grouped_with_its_victim_no_more_often_than_an_honest_node(tmp_path, size) -> None:
    base = together_count(*pool(tmp_path / "honest", None), size)
    expected = FORMATIONS * (size - 1) / (NODES - 1)  # the victim is one of the 7 others
    noise = 3 * math.sqrt(expected * (1 - expected / FORMATIONS))
    assert abs(base - expected) <= noise, (base, expected)  # the honest base rate is the uniform one
    for kind in ("null", "slow", "stretch"):
        seen = together_count(*pool(tmp_path / kind, kind), size)
        assert seen <= base + noise, (kind, seen, base)


def test_the_attackers_reports_dispute_it_and_the_draw_not_its_figure_picks_the_seed(tmp_path) -> None:
    make, attacker, victim = pool(tmp_path, "null")
    with make() as s:
        free = [candidate(row, {}, {}) for row in s.query(NodeRow).all()]
        measured, disputed = placement_links(s, free)
    assert attacker in disputed and victim not in disputed
    assert frozenset((attacker, victim)) not in measured  # its one honest link: not counted either
    make, attacker, _ = pool(tmp_path / "honest", None)
    with make() as s:
        latest = latest_proofs(s)
        flops = {a: p.flops or 0 for a, p in latest.items()}
        free = [candidate(row, flops) for row in s.query(NodeRow).all()]
    seeds = [form_groups(free, [parse_topology_name("2x64GB")], draw=f"{i:032x}")[0].members[0].address
             for i in range(64)]  # fmt: skip
    assert len(set(seeds)) == NODES  # every one of the band seeds sometimes, not the highest figure


def test_a_null_for_a_node_nobody_can_call_is_no_dispute(tmp_path) -> None:
    from orchestrator.groups.nearness import disputed_nodes

    a, b, nat = (Wallet.create().address for _ in range(3))
    said = {(a, b): 5.0, (b, a): 5.2, (a, nat): None, (nat, a): 7.0, (b, nat): None, (nat, b): 6.0}
    assert disputed_nodes(said, unreachable=[nat]) == set()
    assert disputed_nodes(said) == {a, b}
    assert disputed_nodes({(a, b): 5.0, (b, a): 50.0}) == {a, b}  # disagreeing figures: both ends
