"""A member whose task failed for good (still Healthy, still heartbeating) breaks its group, and its node
sits that task out for the cooldown; on a real (SQLite, migrated) database."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from intellect.identity import Wallet
from intellect.wire.heartbeat import TaskStatus
from intellect.wire.nodes import ComputeSpecs, NodeMetadata
from intellect.wire.tasks import TaskSpec, TaskState
from orchestrator.db import make_engine, migrate, session_factory
from orchestrator.groups.reconcile import reconcile
from orchestrator.groups.scheduler import GroupKeeper, GroupScheduler
from orchestrator.groups.topology import Topology
from orchestrator.models import AssignmentRow, AuditRow, GroupMemberRow, NodeRow, TaskRow, utcnow
from orchestrator.settings import OrchestratorSettings
from orchestrator.store.assignments import AssignmentStore

PAIR = {"pair": Topology(name="pair", min_size=2, max_size=2)}
ERROR = "exited with code 1 after 3 restart(s)"


def sessions(tmp_path) -> sessionmaker[Session]:
    engine = make_engine(f"sqlite:///{tmp_path / 'o.db'}")
    migrate(engine)
    return session_factory(engine)


def report(make: sessionmaker[Session], address: str, task_id: str, state: TaskState,
           detail: str | None = None) -> None:
    """The node's heartbeat reports a new state for the task: the heartbeat hands it to the assignment
    store, which upserts the row, stamped now."""
    AssignmentStore(make).record(address, TaskStatus(task_id=task_id, state=state, detail=detail))


def add_node(session: Session, port: int) -> str:
    address = Wallet.create().address
    meta = NodeMetadata(node_address=address, provider_address=Wallet.create().address, ip_address="10.0.0.1",
                        port=port, compute_specs=ComputeSpecs(cpu_cores=8, ram_mb=1, disk_free_mb=1))
    session.add(NodeRow(address=address, state="Healthy", misses=0, in_pool=True, invite_attempts=0,
                        ip_address="10.0.0.1", port=port, node_metadata=meta.model_dump(mode="json"),
                        state_changed_at=utcnow(), created_at=utcnow()))
    return address


def add_task(session: Session, topologies: list[str]) -> str:
    spec = {"name": "t", "image": "i",
            "scheduling_config": {"plugins": {"node_groups": {"allowed_topologies": topologies}}}}
    tid = str(uuid.uuid4())
    session.add(TaskRow(id=tid, name="t", spec=TaskSpec.model_validate(spec).model_dump(mode="json"),
                        config_hash="x", created_at=utcnow()))
    return tid


def placement(make: sessionmaker[Session], address: str) -> tuple[str | None, frozenset[str]]:
    """The node's task and the members of its group as the Plan hands them out (None, {}: no group)."""
    with make() as s:
        plan = GroupScheduler().plan(s)
        assigned = plan.task_for(address)
        if assigned is None or assigned.group is None:
            return None, frozenset()
        ring = s.scalars(select(GroupMemberRow.node_address).where(
            GroupMemberRow.group_id == assigned.group.group_id))  # fmt: skip
        return assigned.task.id, frozenset(ring)


def age(make: sessionmaker[Session], address: str, task_id: str, seconds: float) -> None:
    """Move the node's report for the task `seconds` into the past (time passing, without sleeping)."""
    with make() as s, s.begin():
        row = s.scalars(select(AssignmentRow).where(AssignmentRow.node_address == address,
                                                    AssignmentRow.task_id == task_id)).one()
        row.updated_at -= timedelta(seconds=seconds)


def a_pair(tmp_path, grouped: bool = True) -> tuple[sessionmaker[Session], str, str, str]:
    """A fresh database with two Healthy nodes and a task for the pair topology: the session maker, the
    two nodes and the task (`grouped`: the two formed into a group for it)."""
    make = sessions(tmp_path)
    with make() as s, s.begin():
        first, second = add_node(s, 1), add_node(s, 2)
        task = add_task(s, ["pair"])
    if grouped:
        with make() as s, s.begin():
            assert len(reconcile(s, PAIR).formed) == 1
    return make, first, second, task


def test_a_failed_member_dissolves_its_group_and_the_other_regroups_without_it(tmp_path) -> None:
    make, first, second, task = a_pair(tmp_path)
    assert placement(make, first) == (task, {first, second})
    with make() as s, s.begin():
        spare = add_node(s, 3)  # idle: free to take the failed member's place
    report(make, first, task, TaskState.FAILED, ERROR)

    with make() as s, s.begin():
        changes = reconcile(s, PAIR)
    assert len(changes.dissolved) == 1
    reason = changes.dissolved[0][1]
    assert reason == f"member failed: {first} task {task} failed: {ERROR}"
    assert second not in reason
    assert len(changes.formed) == 1 and len(changes.assigned) == 1
    assert placement(make, second) == (task, {second, spare})  # the work goes on with another node
    assert placement(make, first) == (None, frozenset())
    with make() as s:
        audited = s.scalars(select(AuditRow).where(AuditRow.action == "group_dissolved")).one()
        assert audited.detail == {"reason": reason, "task": task}
    # later passes leave it so: the failed node is not grouped for the task, the new group stands
    with make() as s, s.begin():
        assert not reconcile(s, PAIR)


def test_the_failed_node_sits_the_task_out_for_the_cooldown_then_joins_again(tmp_path) -> None:
    make, failing, partner, task = a_pair(tmp_path)
    report(make, failing, task, TaskState.FAILED, ERROR)
    with make() as s, s.begin():
        changes = reconcile(s, PAIR, failed_cooldown_seconds=60)
    # dissolved, and not formed again in the same pass although the two are the only pair there is
    assert len(changes.dissolved) == 1 and not changes.formed
    for _ in range(2):  # nor in the next passes
        with make() as s, s.begin():
            assert not reconcile(s, PAIR, failed_cooldown_seconds=60)
    assert placement(make, partner) == (None, frozenset())
    # the cooldown has passed: the pair forms again, and the old failure (from before this group was
    # formed) does not break the new group
    age(make, failing, task, 61)
    with make() as s, s.begin():
        assert len(reconcile(s, PAIR, failed_cooldown_seconds=60).formed) == 1
    with make() as s, s.begin():
        assert not reconcile(s, PAIR, failed_cooldown_seconds=60)
    assert placement(make, failing) == (task, {failing, partner})
    # it fails again in the new group: dissolved again
    report(make, failing, task, TaskState.RUNNING)
    report(make, failing, task, TaskState.FAILED, "the container could not start")
    with make() as s, s.begin():
        changes = reconcile(s, PAIR, failed_cooldown_seconds=60)
    assert [reason for _, reason in changes.dissolved] == [
        f"member failed: {failing} task {task} failed: the container could not start"]
    assert not changes.formed


def test_without_a_cooldown_the_pair_forms_again_at_once(tmp_path) -> None:
    """The counterpart of the cooldown test: with 0 nothing keeps the failed node out."""
    make, failing, partner, task = a_pair(tmp_path)
    report(make, failing, task, TaskState.FAILED, ERROR)
    with make() as s, s.begin():
        changes = reconcile(s, PAIR, failed_cooldown_seconds=0)
    assert len(changes.dissolved) == 1 and len(changes.formed) == 1
    assert placement(make, failing) == (task, {failing, partner})


def test_restarting_unknown_and_other_tasks_failures_break_nothing(tmp_path) -> None:
    make, first, second, task = a_pair(tmp_path)
    with make() as s, s.begin():
        other = add_task(s, ["solo"])  # never handed to these two
    report(make, first, task, TaskState.RESTARTING, "exited with code 3; restart 1/3")
    report(make, second, task, TaskState.UNKNOWN, "docker runtime unavailable")
    report(make, first, other, TaskState.FAILED, ERROR)
    with make() as s, s.begin():
        assert not reconcile(s, PAIR).dissolved
    assert placement(make, first) == (task, {first, second})


def test_a_failure_from_before_the_group_was_formed_breaks_nothing(tmp_path) -> None:
    """A `failed` row from an earlier group's run (the node then had no report for the task since)."""
    make, first, second, task = a_pair(tmp_path, grouped=False)
    report(make, first, task, TaskState.FAILED, ERROR)
    age(make, first, task, 3600)
    with make() as s, s.begin():
        assert len(reconcile(s, PAIR).formed) == 1
    with make() as s, s.begin():
        assert not reconcile(s, PAIR)
    assert placement(make, first) == (task, {first, second})


def test_a_node_sitting_one_task_out_is_grouped_for_another_task_of_the_same_topology(tmp_path) -> None:
    make, failing, partner, older = a_pair(tmp_path, grouped=False)
    with make() as s, s.begin():
        newer = add_task(s, ["pair"])  # ties go to the oldest task: `older`, but for the failure
    report(make, failing, older, TaskState.FAILED, ERROR)
    with make() as s, s.begin():
        changes = reconcile(s, PAIR)
    assert len(changes.formed) == 1 and [task for _, task in changes.assigned] == [newer]
    assert placement(make, failing) == (newer, {failing, partner})


def test_the_keeper_uses_the_cooldown_setting(tmp_path) -> None:
    make, failing, partner, task = a_pair(tmp_path, grouped=False)
    assert OrchestratorSettings(state_dir=tmp_path).group_failed_cooldown_seconds == 600
    settings = OrchestratorSettings(state_dir=tmp_path, group_failed_cooldown_seconds=0)

    async def bump() -> int:
        return 1

    patient = GroupKeeper(make, lambda: PAIR, bump, 1.0)
    eager = GroupKeeper(make, lambda: PAIR, bump, 1.0, settings.group_failed_cooldown_seconds)
    assert asyncio.run(patient.run_once()).formed
    report(make, failing, task, TaskState.FAILED, ERROR)
    changes = asyncio.run(patient.run_once())
    assert changes.dissolved and not changes.formed  # the default cooldown keeps it out
    changes = eager.reconcile_once()
    assert not changes.dissolved and changes.formed  # no cooldown: regrouped at once
    assert placement(make, failing) == (task, {failing, partner})
