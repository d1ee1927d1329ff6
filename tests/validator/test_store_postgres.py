"""The validator's database on PostgreSQL (scale-out: `INTELLECT_VALIDATOR_DATABASE_URL`), where SQLite
forgave what PostgreSQL refuses: a node's counter window is kept under "<address>#<task id>" (issue 37's
selection rule, issue 54's forfeits), longer than the 42 characters the column once had. On a real
throw-away cluster (tests/orchestrator/postgres_cluster.py; `scripts/ci-services.sh` installs it)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "orchestrator"))
from postgres_cluster import PostgresCluster, postgres_bin, start_cluster  # noqa: E402

from validator.store import Database, SqlNodeWindows, open_database  # noqa: E402

pytestmark = pytest.mark.slow  # a PostgreSQL server


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    if postgres_bin() is None:
        pytest.skip("no PostgreSQL binaries (initdb) on this machine; scripts/ci-services.sh installs them")
    started = start_cluster()
    yield started
    started.stop()


def test_counter_windows_keyed_by_node_and_task_survive_a_restart_on_postgres(
    cluster: PostgresCluster, tmp_path: Path
) -> None:
    url = cluster.fresh_database("validator_windows")
    key = f"0x{'ab' * 20}#{uuid.uuid4()}"  # 79 characters
    windows = SqlNodeWindows(Database(open_database(url, tmp_path)))
    for counter in (1, 2, 3):
        windows.push(1, key, {"file": f"f{counter}", "counter": counter}, keep=2)
    again = SqlNodeWindows(Database(open_database(url, tmp_path)))  # a restarted validator
    window = again.push(1, key, {"file": "f4", "counter": 4, "forfeit": "stale step label"}, keep=2)
    assert [e["counter"] for e in window] == [3, 4] and window[-1]["forfeit"] == "stale step label"


def test_an_older_validators_postgres_database_is_widened(cluster: PostgresCluster, tmp_path: Path) -> None:
    """A database made when the column held 42 characters takes the longer key after a restart."""
    from sqlalchemy import create_engine, text

    url = cluster.fresh_database("validator_old")
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE node_windows (pool_id INTEGER NOT NULL, node VARCHAR(42) "
                          "NOT NULL, entries TEXT, PRIMARY KEY (pool_id, node))"))
    engine.dispose()
    windows = SqlNodeWindows(Database(open_database(url, tmp_path)))
    key = f"0x{'cd' * 20}#{uuid.uuid4()}"
    assert windows.push(1, key, {"file": "f1", "counter": 1}, keep=4) == [{"file": "f1", "counter": 1}]


def test_a_database_made_before_the_migrations_is_taken_up_on_postgres(
    cluster: PostgresCluster, tmp_path: Path
) -> None:
    """What the store made on PostgreSQL before its Alembic migrations (its tables from the models by
    `create_all`, no version table) keeps its rows and ends with the schema a fresh database gets."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy import create_engine, text

    from validator.store import VERSION_TABLE, Base, ChainCursor

    url = cluster.fresh_database("validator_pre_alembic")
    engine = create_engine(url)
    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO cursor (pool_id, next_block) VALUES (7, 103)"))
        conn.execute(text("INSERT INTO node_windows (pool_id, node, entries) VALUES (7, 'n#t', :e)"),
                     {"e": '[{"c": 1}]'})
    engine.dispose()
    db = Database(open_database(url, tmp_path))
    assert ChainCursor(db).next_block(7, default=0) == 103
    assert SqlNodeWindows(db).push(7, "n#t", {"c": 2}, keep=4) == [{"c": 1}, {"c": 2}]
    with db.sessions.kw["bind"].connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        assert context.get_current_revision() is not None
        assert compare_metadata(context, Base.metadata) == []
