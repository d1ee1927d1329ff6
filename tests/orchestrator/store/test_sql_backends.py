"""The orchestrator's SQL schema on both supported databases: SQLite (one box) and PostgreSQL (scale-out).

Each test runs twice (see the `database_url` fixture): Alembic migrations must build the same schema
on both, and the constraints the orchestrator relies on for correctness must hold on both.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import inspect, select, text
from sqlalchemy.exc import IntegrityError

from orchestrator.db import make_engine, migrate, session_factory
from orchestrator.models import (
    AssignmentRow,
    FileCounterRow,
    GroupMemberRow,
    NodeGroupRow,
    NodeRow,
    TaskRow,
    UploadRow,
    utcnow,
)

TABLES = {"nodes", "tasks", "assignments", "audit_log", "uploads", "file_counters", "node_groups",
          "group_members", "hardware_proofs"}
NODE = "0x" + "ab" * 20


@pytest.fixture
def engine(database_url: str):
    engine = make_engine(database_url)
    migrate(engine)
    yield engine
    engine.dispose()


def test_migrations_build_every_table_and_are_idempotent(engine) -> None:
    assert set(inspect(engine).get_table_names()) >= TABLES
    migrate(engine)  # a second start on an up-to-date database changes nothing
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == "0005"
    assert "joined_via" in {c["name"] for c in inspect(engine).get_columns("nodes")}


def test_rows_round_trip_json_and_timestamps(engine) -> None:
    sessions = session_factory(engine)
    spec = {"image": "intellect/tiny:1", "env": {"A": "1"}, "cmd": ["run", "--steps", "3"]}
    now = utcnow()
    with sessions.begin() as session:
        session.add(NodeRow(address=NODE, state="healthy", node_metadata={"gpu": {"count": 2}},
                            last_heartbeat_at=now))
        session.add(TaskRow(id="t1", name="tiny", spec=spec, config_hash="c" * 64))
    with sessions.begin() as session:
        session.add(AssignmentRow(task_id="t1", node_address=NODE, state="running"))
    with sessions() as session:
        node = session.get(NodeRow, NODE)
        assert node is not None and node.node_metadata == {"gpu": {"count": 2}}
        assert abs(node.last_heartbeat_at - now) < timedelta(seconds=1)
        assert session.get(TaskRow, "t1").spec == spec
        assert session.scalars(select(AssignmentRow.state)).all() == ["running"]


def test_one_assignment_per_task_and_node(engine) -> None:
    sessions = session_factory(engine)
    with sessions.begin() as session:
        session.add(TaskRow(id="t1", name="tiny", spec={}, config_hash="c" * 64))
        session.flush()  # no ORM relationship orders the inserts, so the task goes first explicitly
        session.add(AssignmentRow(task_id="t1", node_address=NODE, state="running"))
    with pytest.raises(IntegrityError), sessions.begin() as session:
        session.add(AssignmentRow(task_id="t1", node_address=NODE, state="failed"))


def test_assignment_needs_an_existing_task(engine) -> None:
    with pytest.raises(IntegrityError), session_factory(engine).begin() as session:
        session.add(AssignmentRow(task_id="missing", node_address=NODE, state="running"))


def test_one_upload_per_content(engine) -> None:
    """`sha256` is unique: the same bytes can never be granted (and later paid for on chain) twice."""
    sessions = session_factory(engine)

    def upload(key: str) -> UploadRow:
        return UploadRow(id=str(uuid.uuid4()), node_address=NODE, task_id="t1", key=key, sha256="d" * 64,
                         size=10, work_units=1, file_index=0, state="granted",
                         expires_at=utcnow() + timedelta(minutes=5))

    with sessions.begin() as session:
        session.add(upload("a/0.parquet"))
    with pytest.raises(IntegrityError), sessions.begin() as session:
        session.add(upload("a/1.parquet"))


def test_deleting_a_group_releases_its_members(engine) -> None:
    sessions = session_factory(engine)
    with sessions.begin() as session:
        session.add(NodeGroupRow(id="g1", topology="pair"))
        session.flush()
        session.add(GroupMemberRow(node_address=NODE, group_id="g1", position=0))
    with sessions.begin() as session:
        session.execute(NodeGroupRow.__table__.delete().where(NodeGroupRow.id == "g1"))
    with sessions() as session:
        assert session.get(GroupMemberRow, NODE) is None


def test_file_counter_increments_are_not_lost_under_concurrency(engine) -> None:
    """The upload grant reads the per-(node, task) counter `with_for_update` and bumps it; parallel
    grants (thread pool, or two replicas on Postgres) must each get a distinct index."""
    sessions = session_factory(engine)
    with sessions.begin() as session:
        session.add(FileCounterRow(node_address=NODE, task_id="t1", count=0))
    seen: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def grant() -> None:
        try:
            for _ in range(5):
                with sessions.begin() as session:
                    counter = session.get(FileCounterRow, (NODE, "t1"), with_for_update=True)
                    assert counter is not None
                    index = counter.count
                    counter.count = index + 1
                with lock:
                    seen.append(index)
        except BaseException as exc:  # reported below with the failing database
            errors.append(exc)

    threads = [threading.Thread(target=grant) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(seen) == list(range(20))
    with sessions() as session:
        assert session.get(FileCounterRow, (NODE, "t1")).count == 20


def test_state_mirror_from_columns_matches_the_rows(engine) -> None:
    """`NodeBook.mirror_states` (three plain columns, the start-up rebuild) holds exactly what
    `mirrored(row)` gives row by row: every state, in and out of the pool."""
    from redis.asyncio import Redis

    from intellect.wire.nodes import NodeState
    from orchestrator.live import LiveStore
    from orchestrator.store.nodes import NodeBook, mirrored

    sessions = session_factory(engine)
    with sessions() as session, session.begin():
        for i, (state, in_pool) in enumerate((s, p) for s in NodeState for p in (True, False)):
            session.add(NodeRow(address=f"0x{i:040x}", state=state.value, in_pool=in_pool, misses=0,
                                invite_attempts=0))
    with sessions() as session:
        expected = {row.address: mirrored(row) for row in session.scalars(select(NodeRow))}
    found = NodeBook(sessions, LiveStore(Redis(), 1, 20)).mirror_states()  # SQL only: Redis is never reached
    assert found == expected
    assert None in found.values() and NodeState.DISCOVERED in found.values()  # outside vs inside the pool
