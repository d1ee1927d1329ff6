"""The validator's database migrated with Alembic (validator/migrations/), databases made before included.

`tests/fixtures/validator/pre-alembic.db` was made by the store as it was before the migrations (commit
63e5307: `create_all` plus ALTER TABLE by hand at every start), through its own classes: three
submissions of pool 7 (one judged and accepted, one waiting on a retry after a storage error, one held
behind it), the cursor at block 103 with three block hashes, the accepted file's seen file and rows,
and a counter window keyed "<address>#<task id>". A database from the first release is built here from
that release's DDL (no later columns, no node windows). Each must come out with every row, the same
schema a fresh database gets (the models, compared by Alembic), and the stores working on it.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from validator.store import (
    MIGRATIONS,
    VERSION_TABLE,
    Base,
    ChainCursor,
    Database,
    SqlNodeWindows,
    SqlSeenStore,
    Submissions,
    Verdicts,
    open_database,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "validator" / "pre-alembic.db"
NODE = "0x" + "ab" * 20
FIRST_RELEASE_DDL = [  # the tables of the store's first release, as its create_all made them
    "CREATE TABLE cursor (pool_id INTEGER NOT NULL, next_block BIGINT NOT NULL, PRIMARY KEY (pool_id))",
    "CREATE TABLE blocks (pool_id INTEGER NOT NULL, number BIGINT NOT NULL, hash VARCHAR(66) NOT NULL, "
    "PRIMARY KEY (pool_id, number))",
    "CREATE TABLE submissions (pool_id INTEGER NOT NULL, work_key VARCHAR(66) NOT NULL, node VARCHAR(42) "
    "NOT NULL, provider VARCHAR(42) NOT NULL, units BIGINT NOT NULL, block_number BIGINT NOT NULL, "
    "tx_hash VARCHAR(66) NOT NULL, submitted_at BIGINT NOT NULL, trainer_step INTEGER, state VARCHAR(16) "
    "NOT NULL, attempts INTEGER NOT NULL, next_attempt_at FLOAT NOT NULL, last_error TEXT, "
    "PRIMARY KEY (pool_id, work_key))",
    "CREATE INDEX ix_submissions_node ON submissions (node)",
    "CREATE INDEX ix_submissions_block_number ON submissions (block_number)",
    "CREATE INDEX ix_submissions_state ON submissions (state)",
    "CREATE TABLE verdicts (id INTEGER NOT NULL, pool_id INTEGER NOT NULL, work_key VARCHAR(66) NOT NULL, "
    "node VARCHAR(42) NOT NULL, sha256 VARCHAR(64) NOT NULL, verdict VARCHAR(16) NOT NULL, reasons TEXT "
    "NOT NULL, rows INTEGER NOT NULL, tokens INTEGER NOT NULL, step INTEGER, seconds FLOAT NOT NULL, "
    "timings TEXT NOT NULL, block_number BIGINT NOT NULL, file_path TEXT, vote_tx VARCHAR(66), vote_state "
    "VARCHAR(16) NOT NULL, vote_error TEXT, decided_at FLOAT NOT NULL, PRIMARY KEY (id))",
    "CREATE INDEX ix_verdicts_pool_id ON verdicts (pool_id)",
    "CREATE INDEX ix_verdicts_work_key ON verdicts (work_key)",
    "CREATE INDEX ix_verdicts_node ON verdicts (node)",
    "CREATE INDEX ix_verdicts_verdict ON verdicts (verdict)",
    "CREATE TABLE seen_files (pool_id INTEGER NOT NULL, sha256 VARCHAR(64) NOT NULL, "
    "PRIMARY KEY (pool_id, sha256))",
    "CREATE TABLE seen_rows (pool_id INTEGER NOT NULL, digest VARCHAR(128) NOT NULL, "
    "PRIMARY KEY (pool_id, digest))",
]


def head() -> str:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    revision = ScriptDirectory.from_config(config).get_current_head()
    assert revision is not None
    return revision


def assert_current(sessions: sessionmaker[Session]) -> None:
    """At the newest revision, with exactly the tables, columns, types and indexes of the models."""
    engine = sessions.kw["bind"]
    assert isinstance(engine, Engine)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        assert context.get_current_revision() == head()
        assert compare_metadata(context, Base.metadata) == []


def test_a_fresh_database_gets_the_schema_of_the_models(tmp_path: Path) -> None:
    assert_current(open_database(None, tmp_path))


def test_a_database_of_the_hand_migrated_store_keeps_every_row(tmp_path: Path) -> None:
    shutil.copy(FIXTURE, tmp_path / "validator.db")
    sessions = open_database(None, tmp_path)
    assert_current(sessions)
    db = Database(sessions)
    cursor, submissions, verdicts = ChainCursor(db), Submissions(db), Verdicts(db)
    assert cursor.next_block(7, default=0) == 103
    assert [n for n, _ in cursor.recent_blocks(7)] == [102, 101, 100]
    due = submissions.due()  # the file waiting on its retry; the one after it held behind it
    assert [(s.block_number, s.attempts) for s in due] == [(101, 1)]
    assert due[0].last_error == "fetch: storage unreachable"
    assert submissions.pending_count() == 2
    [verdict] = verdicts.page(pool_id=7, node=NODE, after=0, limit=10)
    assert (verdict.id, verdict.verdict, verdict.tokens, verdict.step) == (1, "accept", 64, 3)
    assert verdict.block_number == 100 and verdict.judged_by is None
    assert verdicts.by_sha256("ee" * 32) is not None and verdicts.counts() == {"accept": 1}
    seen = SqlSeenStore(db)
    assert seen.file_seen(7, "ee" * 32) and seen.rows_seen(7, ["r1", "r2", "r3"]) == {"r1", "r2"}
    window = SqlNodeWindows(db).push(7, f"{NODE}#task-1", {"file": "b.parquet", "counter": 2}, keep=8)
    assert [e["counter"] for e in window] == [1, 2]
    assert_current(open_database(None, tmp_path))  # a second start: nothing to do


def test_a_first_release_database_gains_the_later_columns_and_tables(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "validator.db") as conn:
        for statement in FIRST_RELEASE_DDL:
            conn.execute(statement)
        conn.execute("INSERT INTO submissions VALUES (7, '0x01', ?, ?, 5, 40, '0x02', 1700000000, NULL, "
                     "'pending', 0, 0.0, NULL)", (NODE, "0x" + "cd" * 20))
        conn.execute("INSERT INTO cursor VALUES (7, 41)")
    sessions = open_database(None, tmp_path)
    assert_current(sessions)
    with sessions() as session:
        row = session.execute(text("SELECT log_index, leaf, trainer_step_before, units FROM submissions"))
        values = tuple(row.one())
    assert values == (0, 0, None, 5)  # the added columns' values for a row made before them
    db = Database(sessions)
    assert ChainCursor(db).next_block(7, default=0) == 41
    assert [s.work_key for s in Submissions(db).due()] == ["0x01"]
    assert SqlNodeWindows(db).push(7, NODE, {"counter": 1}, keep=4) == [{"counter": 1}]
