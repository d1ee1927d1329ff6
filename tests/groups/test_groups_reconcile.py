"""`reconcile` on a real (SQLite, migrated) database: nearest-first formation from discovery locations,
merging small idle groups, dissolving on death, and the Plan built from what is stored."""

from __future__ import annotations

import hashlib
import hmac
import re
import uuid

import zmq
from pydantic import SecretStr
from zmq.utils import z85

from intellect.identity import Wallet
from intellect.wire.nodes import ComputeSpecs, GpuSpec, Location, NodeMetadata
from intellect.wire.tasks import TaskSpec
from orchestrator.db import make_engine, migrate, session_factory
from orchestrator.groups.reconcile import candidate, reconcile
from orchestrator.groups.scheduler import GroupScheduler, member_keys
from orchestrator.groups.topology import Topology
from orchestrator.models import NodeGroupRow, NodeRow, TaskRow, utcnow
from orchestrator.server import group_secret_key
from orchestrator.settings import OrchestratorSettings
from orchestrator.store.hardware import PROVEN, WRONG, HardwareBook, ProofRecord, proven_flops

CITIES = {"berlin": (52.52, 13.40), "paris": (48.86, 2.35), "tokyo": (35.68, 139.69),
          "osaka": (34.69, 135.50)}


def sessions(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'o.db'}")
    migrate(engine)
    return session_factory(engine)


def add_node(session, city: str | None, gpu_mb: int = 0, state: str = "Healthy", port: int = 9000,
             p2p_port: int | None = None) -> str:
    address = Wallet.create().address
    gpus = [GpuSpec(model="H100", count=1, memory_mb=gpu_mb)] if gpu_mb else []
    where = Location(latitude=CITIES[city][0], longitude=CITIES[city][1]) if city else None
    specs = ComputeSpecs(gpus=gpus, cpu_cores=8, ram_mb=1, disk_free_mb=1)
    meta = NodeMetadata(node_address=address, provider_address=Wallet.create().address, ip_address="10.0.0.1",
                        port=port, p2p_port=p2p_port, compute_specs=specs, location=where)
    session.add(NodeRow(address=address, state=state, misses=0, in_pool=True, invite_attempts=0,
                        ip_address="10.0.0.1", port=port, node_metadata=meta.model_dump(mode="json"),
                        state_changed_at=utcnow(), created_at=utcnow()))
    return address


def add_task(session, topologies: list[str] | None, max_groups: int | None = None) -> str:
    spec: dict = {"name": "t", "image": "i"}
    if topologies:
        groups = {"allowed_topologies": topologies} | ({"max_groups": max_groups} if max_groups else {})
        spec["scheduling_config"] = {"plugins": {"node_groups": groups}}
    tid = str(uuid.uuid4())
    session.add(TaskRow(id=tid, name="t", spec=TaskSpec.model_validate(spec).model_dump(mode="json"),
                        config_hash="x", created_at=utcnow()))
    return tid


def test_nearest_first_requirements_and_plan(tmp_path) -> None:
    make = sessions(tmp_path)
    with make() as s, s.begin():
        berlin, tokyo = add_node(s, "berlin", 80_000, port=1), add_node(s, "tokyo", 80_000, port=2)
        paris, osaka = add_node(s, "paris", 80_000, port=3), add_node(s, "osaka", 80_000, port=4)
        small = add_node(s, "berlin", 16_000)  # too little GPU memory for "2x64GB"
        plain = add_task(s, None)
        grouped = add_task(s, ["2x64GB"])
    with make() as s, s.begin():
        changes = reconcile(s, {})
    assert len(changes.formed) == 2 and len(changes.assigned) == 2
    with make() as s:
        plan = GroupScheduler().plan(s)
    placed = {a: plan.task_for(a) for a in (berlin, tokyo, paris, osaka)}
    by_group: dict[str, set[str]] = {}
    for address, assigned in placed.items():
        assert assigned is not None and assigned.task.id == grouped and assigned.group is not None
        by_group.setdefault(assigned.group.group_id, set()).add(address)
    assert sorted(map(sorted, by_group.values())) == sorted([sorted([berlin, paris]), sorted([tokyo, osaka])])
    # the ring: each member's next P2P address is its partner's advertised address
    for assigned in placed.values():
        assert assigned.group.group_size == 2 and assigned.group.next_p2p_address.startswith("10.0.0.1:")
    assert plan.task_for(small).task.id == plain and plan.task_for(small).group is None
    # nothing changes on a second pass
    with make() as s, s.begin():
        assert not reconcile(s, {})


def test_merge_small_idle_groups_and_dissolve_on_death(tmp_path) -> None:
    make = sessions(tmp_path)
    flexible = {"flex": Topology(name="flex", min_size=1, max_size=3)}
    with make() as s, s.begin():
        first = add_node(s, None)
        task = add_task(s, ["flex"])
    with make() as s, s.begin():
        assert len(reconcile(s, flexible).formed) == 1  # a group of one (min_size 1)
    with make() as s, s.begin():
        second = add_node(s, None)
    with make() as s, s.begin():
        assert len(reconcile(s, flexible).formed) == 1  # the newcomer alone: another group of one
    with make() as s, s.begin():
        changes = reconcile(s, flexible)  # two idle groups of one that fit in 3: merged
    assert len(changes.merged) == 1
    with make() as s:
        plan = GroupScheduler().plan(s)
    a, b = plan.task_for(first), plan.task_for(second)
    assert a.group.group_id == b.group.group_id and a.group.group_size == 2 and a.task.id == task
    # a member dies: the group dissolves, the survivor forms a new group of one for the same task
    with make() as s, s.begin():
        s.get(NodeRow, second).state = "Dead"
    with make() as s, s.begin():
        changes = reconcile(s, flexible)
    assert changes.dissolved and "Dead" in changes.dissolved[0][1] and len(changes.formed) == 1
    with make() as s:
        plan = GroupScheduler().plan(s)
    assert plan.task_for(first).group.group_size == 1 and plan.task_for(second) is None


def expected_secret(key: bytes, task_id: str, group_id: str) -> str:
    return hmac.new(key, f"group-secret|{task_id}|{group_id}".encode(), hashlib.sha256).hexdigest()


def test_group_secrets_are_shared_within_a_group_and_differ_across_groups_and_tasks(tmp_path) -> None:
    make = sessions(tmp_path)
    key = b"k" * 32
    with make() as s, s.begin():
        nodes = [add_node(s, city, 80_000, port=i + 1) for i, city in enumerate(CITIES)]
        task = add_task(s, ["2x64GB"])
    with make() as s, s.begin():
        assert len(reconcile(s, {}).formed) == 2
    with make() as s:
        plan = GroupScheduler(key).plan(s)
    by_group: dict[str, set[str]] = {}
    for address in nodes:
        group = plan.task_for(address).group
        assert group is not None and group.secret is not None and re.fullmatch(r"[0-9a-f]{64}", group.secret)
        assert group.secret == expected_secret(key, task, group.group_id)
        by_group.setdefault(group.group_id, set()).add(group.secret)
    assert all(len(secrets) == 1 for secrets in by_group.values())  # one secret per group ...
    assert len(set.union(*by_group.values())) == 2  # ... and another for the other group
    # the same on every replica (same key); another key, another secret; no key, no secret
    with make() as s:
        again, other = GroupScheduler(key).plan(s), GroupScheduler(b"x" * 32).plan(s)
        none = GroupScheduler().plan(s)
    for address in nodes:
        assert again.task_for(address).group.secret == plan.task_for(address).group.secret
        assert other.task_for(address).group.secret not in (None, plan.task_for(address).group.secret)
        assert none.task_for(address).group.secret is None
    # the same group given another task gets another secret
    gid = plan.task_for(nodes[0]).group.group_id
    with make() as s, s.begin():
        second = add_task(s, ["2x64GB"])
        s.get(NodeGroupRow, gid).task_id = second
    with make() as s:
        moved = GroupScheduler(key).plan(s).task_for(nodes[0])
    assert moved.task.id == second and moved.group.group_id == gid
    assert moved.group.secret == expected_secret(key, second, gid) != plan.task_for(nodes[0]).group.secret


def test_each_member_gets_its_own_transport_secret_and_every_members_public_key(tmp_path) -> None:
    """Two members of one group: different secrets, the same public keys in stage order, each member's
    public key that of its own secret (so no member can speak on a link as the other)."""
    make, key = sessions(tmp_path), b"k" * 32
    with make() as s, s.begin():
        nodes = [add_node(s, "berlin", 80_000, port=1), add_node(s, "paris", 80_000, port=2)]
        task = add_task(s, ["2x64GB"])
    with make() as s, s.begin():
        assert len(reconcile(s, {}).formed) == 1
    with make() as s:
        plan, none = GroupScheduler(key).plan(s), GroupScheduler().plan(s)
    ring = sorted(nodes, key=lambda a: plan.task_for(a).group.group_index)
    groups = [plan.task_for(a).group for a in ring]
    assert groups[0].group_keys == groups[1].group_keys and len(groups[0].group_keys) == 2
    assert groups[0].member_secret != groups[1].member_secret
    assert all(g.members == ring for g in groups)  # every member's node address, in stage order (issue 55)
    for g in groups:
        assert g.group_keys[g.group_index] == z85.decode(zmq.curve_public(z85.encode(
            bytes.fromhex(g.member_secret)))).hex()  # fmt: skip
    gid = groups[0].group_id
    derived = member_keys(key, task, gid, ring)  # what every replica derives
    assert [(g.member_secret, g.group_keys[g.group_index]) for g in groups] == derived
    # another node in member 1's place gets other keys; member 0's stay
    moved = member_keys(key, task, gid, [ring[0], Wallet.create().address])
    assert moved[0] == derived[0] and moved[1][0] != derived[1][0]
    assert all(none.task_for(a).group.member_secret is None and none.task_for(a).group.group_keys is None
               for a in nodes)  # no key, no member keys


def test_the_group_key_is_a_sub_key_of_the_storage_secret_shared_by_replicas(tmp_path) -> None:
    configured = OrchestratorSettings(state_dir=tmp_path / "a", storage_secret=SecretStr("s" * 40))
    replica = OrchestratorSettings(state_dir=tmp_path / "b", storage_secret=SecretStr("s" * 40))
    key = group_secret_key(configured)
    assert key == group_secret_key(replica) == hmac.new(b"s" * 40, b"group-secrets", hashlib.sha256).digest()
    assert key != b"s" * 40
    # generated: one file in state_dir, so a restart (or a replica on the same disk) derives the same key
    generated = OrchestratorSettings(state_dir=tmp_path / "c")
    assert group_secret_key(generated) == group_secret_key(OrchestratorSettings(state_dir=tmp_path / "c"))
    assert (tmp_path / "c" / "storage-secret").exists() and group_secret_key(generated) != key


def test_peers_are_given_the_advertised_p2p_port_else_the_api_port(tmp_path) -> None:
    make = sessions(tmp_path)
    with make() as s, s.begin():
        inbox = add_node(s, "berlin", 80_000, port=9001, p2p_port=7001)
        api_only = add_node(s, "paris", 80_000, port=9002)
        add_task(s, ["2x64GB"])
    with make() as s:
        assert candidate(s.get(NodeRow, inbox)).p2p_address == "10.0.0.1:7001"
        assert candidate(s.get(NodeRow, api_only)).p2p_address == "10.0.0.1:9002"
    with make() as s, s.begin():
        assert len(reconcile(s, {}).formed) == 1
    with make() as s:
        plan = GroupScheduler().plan(s)
    # the ring: each member is told where the next one listens
    assert plan.task_for(inbox).group.next_p2p_address == "10.0.0.1:9002"
    assert plan.task_for(api_only).group.next_p2p_address == "10.0.0.1:7001"


def test_a_member_behind_nat_dials_both_links_and_its_predecessor_listens(tmp_path) -> None:
    """A node that fetched its invite (nobody could call it) joins a group only next to reachable ones;
    the plan tells it to dial its predecessor's listening outbox (P2P port + 1), and tells the
    predecessor to listen there."""
    make = sessions(tmp_path)
    with make() as s, s.begin():
        public = add_node(s, "berlin", 80_000, port=9001, p2p_port=7001)
        home = add_node(s, "paris", 80_000, port=9002, p2p_port=7002)
        home_too = add_node(s, "paris", 80_000, port=9003, p2p_port=7003)
        for address in (home, home_too):
            s.get(NodeRow, address).joined_via = "pull"
        add_task(s, ["2x64GB"])
    with make() as s:
        assert not candidate(s.get(NodeRow, home)).reachable and candidate(s.get(NodeRow, public)).reachable
    with make() as s, s.begin():
        assert len(reconcile(s, {}).formed) == 1  # the two behind NAT cannot make a pair
    with make() as s:
        plan = GroupScheduler().plan(s)
    placed = [a for a in (home, home_too) if plan.task_for(a) is not None and plan.task_for(a).group]
    assert len(placed) == 1
    inside, outside = plan.task_for(placed[0]).group, plan.task_for(public).group
    assert inside.prev_p2p_address == "10.0.0.1:7002" and not inside.next_dials_in  # public's 7001 + 1
    assert outside.next_dials_in and outside.prev_p2p_address is None
    assert inside.next_p2p_address == "10.0.0.1:7001"  # its outbox dials public's inbox as usual


def test_groups_are_placed_by_proven_figures_never_claimed_ones(tmp_path) -> None:
    """A node that claims a huge throughput but proved nothing (or whose latest answer was wrong) does not
    seed a group; nodes are grouped by the FLOP/s their hardware challenges proved (docs/hardware.md)."""
    make = sessions(tmp_path)
    pair = {"pair": Topology(name="pair", min_size=2, max_size=2)}
    with make() as s, s.begin():
        claimer, fast, slow, also_fast = (add_node(s, None, port=p) for p in (1, 2, 3, 4))
        s.get(NodeRow, claimer).node_metadata = {**s.get(NodeRow, claimer).node_metadata, "throughput": 1e9}
        add_task(s, ["pair"])
    book = HardwareBook(make)
    for address, flops in ((fast, 5e9), (slow, 1e9), (also_fast, 4.5e9), (claimer, 9e9)):
        book.record(ProofRecord(node_address=address, outcome=PROVEN, n=1024, precision="float32",
                                flops=flops))
    book.record(ProofRecord(node_address=claimer, outcome=WRONG, n=1024, precision="float32",
                            reasons=("freivalds: C·r is not A·(B·r)",)))  # its latest answer: wrong
    with make() as s:
        assert proven_flops(s) == {fast: 5e9, slow: 1e9, also_fast: 4.5e9}
        assert candidate(s.get(NodeRow, claimer), proven_flops(s)).throughput is None
    with make() as s, s.begin():
        assert len(reconcile(s, pair).formed) == 2
    with make() as s:
        plan = GroupScheduler().plan(s)
    group_of = {a: plan.task_for(a).group.group_id for a in (claimer, fast, slow, also_fast)}
    assert group_of[fast] == group_of[also_fast] != group_of[claimer] == group_of[slow]


def test_groups_are_placed_by_round_trips_both_ends_measured_not_by_declared_places(tmp_path) -> None:
    """Berlin and Paris declare themselves near, Tokyo and Osaka near; the links both ends measured say
    Berlin–Tokyo and Paris–Osaka are the short ones (say, the declared places are lies): groups follow
    the measurements. A link only one end reports, however short, does not count."""
    from orchestrator.store.round_trips import RoundTripBook

    make = sessions(tmp_path)
    with make() as s, s.begin():
        berlin, tokyo = add_node(s, "berlin", 80_000, port=1), add_node(s, "tokyo", 80_000, port=2)
        paris, osaka = add_node(s, "paris", 80_000, port=3), add_node(s, "osaka", 80_000, port=4)
        add_task(s, ["2x64GB"])
    book = RoundTripBook(make)
    everyone = [berlin, tokyo, paris, osaka]
    near = {frozenset((berlin, tokyo)): 2.0, frozenset((paris, osaka)): 3.0}
    for a in everyone:
        book.record(a, {b: near.get(frozenset((a, b)), 80.0) for b in everyone if b != a})
    with make() as s, s.begin():
        changes = reconcile(s, {})
    assert len(changes.formed) == 2
    with make() as s:
        plan = GroupScheduler().plan(s)
    together = {a: plan.task_for(a).group.group_id for a in everyone}
    assert together[berlin] == together[tokyo] and together[paris] == together[osaka]
    assert together[berlin] != together[paris]
    # what the API shows: each link both ends measured, at the larger figure
    book.record(paris, {berlin: 0.1})  # one end's claim: Berlin measured 80 ms to Paris, which wins
    links = book.links()
    assert links[frozenset((berlin, tokyo))] == 2.0 and links[frozenset((paris, berlin))] == 80.0
    assert book.of(berlin)[tokyo] == 2.0
    book.record(osaka, {tokyo: None})  # unreachable from one end: that link has no figure
    assert frozenset((osaka, tokyo)) not in book.links()


def test_a_task_with_max_groups_leaves_the_other_nodes_to_single_node_tasks(tmp_path) -> None:
    """Two pipeline tasks of one group each (2 and 3 members) next to a single-node task: seven nodes make
    one group of each and two single nodes, and a group that breaks is replaced by one, not more."""
    make = sessions(tmp_path)
    with make() as s, s.begin():
        nodes = [add_node(s, "berlin", port=i) for i in range(1, 8)]
        plain = add_task(s, None)
        pairs, triples = add_task(s, ["2x0GB"], max_groups=1), add_task(s, ["3x0GB"], max_groups=1)
    with make() as s, s.begin():
        changes = reconcile(s, {})
        assert len(changes.formed) == 2 and len(changes.assigned) == 2
    with make() as s, s.begin():
        assert not reconcile(s, {})  # nothing more to form: both tasks have their group
    with make() as s:
        plan = GroupScheduler().plan(s)
    placed = {a: plan.task_for(a) for a in nodes}
    sizes = sorted(len([a for a, p in placed.items() if p and p.task.id == tid]) for tid in (pairs, triples))
    assert sizes == [2, 3]
    singles = [p for p in placed.values() if p is not None and p.task.id == plain]
    assert len(singles) == 2 and all(p.group is None for p in singles)
    # a member of the pair dies: its group goes, and one new pair forms from the free nodes
    member = next(a for a, p in placed.items() if p and p.task.id == pairs)
    with make() as s, s.begin():
        s.get(NodeRow, member).state = "Dead"
    with make() as s, s.begin():
        changes = reconcile(s, {})
        assert len(changes.dissolved) == 1 and len(changes.formed) == 1
    with make() as s:
        groups = {g.task_id for g in s.query(NodeGroupRow).all()}
        assert len(s.query(NodeGroupRow).all()) == 2 and groups == {pairs, triples}
