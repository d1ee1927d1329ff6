"""What the validator must never lose, in SQL (SQLite by default, PostgreSQL by URL).

One store class per table group, each the only writer of its tables:
- `ChainCursor`: per pool, the next block to read and the hash of every block consumed (the last
  `KEEP_BLOCKS`), so a reorg is found by a hash mismatch, not only guarded by a fixed depth.
- `Submissions`: every `WorkSubmitted` seen, with its fetch attempts: the work queue.
- `Verdicts`: each decision with reasons, timings and the vote's tx hash; its id is the strictly
  increasing cursor of `GET /verdicts` and `GET /accepted`.
- `SqlSeenStore`: the duplicate memory of the pipeline (`intellect.workloads.SeenStore`).

The watcher records a block's submissions and advances the cursor in one transaction, and a verdict
is written in the same transaction that marks its submission judged: a restart neither skips a
file nor judges one twice.

The schema comes from Alembic migrations (validator/migrations/), run by `open_database` at start like
the orchestrator's: a change to a table here goes with a new revision there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import (
    BigInteger,
    Float,
    Integer,
    String,
    Text,
    and_,
    create_engine,
    delete,
    event,
    exists,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import (
    DeclarativeBase,
    InstrumentedAttribute,
    Mapped,
    Session,
    aliased,
    mapped_column,
    sessionmaker,
)
from sqlalchemy.orm.util import AliasedClass
from sqlalchemy.sql.elements import ColumnElement

from intellect.wire.verdicts import Verdict

KEEP_BLOCKS = 256


class Base(DeclarativeBase):
    pass


class CursorRow(Base):
    __tablename__ = "cursor"
    pool_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    next_block: Mapped[int] = mapped_column(BigInteger)


class BlockRow(Base):
    __tablename__ = "blocks"
    pool_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    number: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    hash: Mapped[str] = mapped_column(String(66))


class SubmissionRow(Base):
    __tablename__ = "submissions"
    pool_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    work_key: Mapped[str] = mapped_column(String(66), primary_key=True)
    node: Mapped[str] = mapped_column(String(42), index=True)
    provider: Mapped[str] = mapped_column(String(42))
    units: Mapped[int] = mapped_column(BigInteger)
    block_number: Mapped[int] = mapped_column(BigInteger, index=True)
    log_index: Mapped[int] = mapped_column(Integer, default=0)  # with block_number: the chain's order
    leaf: Mapped[int] = mapped_column(Integer, default=0)  # a batch's files share its log: their order in it
    tx_hash: Mapped[str] = mapped_column(String(66))
    submitted_at: Mapped[int] = mapped_column(BigInteger)  # chain timestamp
    trainer_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    trainer_step_before: Mapped[int | None] = mapped_column(Integer, nullable=True)  # see Submission
    state: Mapped[str] = mapped_column(String(16), default="pending", index=True)  # pending | judged
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[float] = mapped_column(Float, default=0.0)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)


class VerdictRow(Base):
    __tablename__ = "verdicts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    pool_id: Mapped[int] = mapped_column(Integer, index=True)
    work_key: Mapped[str] = mapped_column(String(66), index=True)
    node: Mapped[str] = mapped_column(String(42), index=True)
    sha256: Mapped[str] = mapped_column(String(64))
    verdict: Mapped[str] = mapped_column(String(16), index=True)
    reasons: Mapped[str] = mapped_column(Text)  # JSON list
    rows: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int] = mapped_column(Integer)
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    seconds: Mapped[float] = mapped_column(Float)
    timings: Mapped[str] = mapped_column(Text)  # JSON object
    judged_by: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON JudgedBy: its limits' record
    block_number: Mapped[int] = mapped_column(BigInteger)
    file_path: Mapped[str | None] = mapped_column(Text, nullable=True)  # kept copy (accepted files)
    vote_tx: Mapped[str | None] = mapped_column(String(66), nullable=True)
    vote_state: Mapped[str] = mapped_column(String(16), default="none")  # none | pending | sent | failed
    vote_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    decided_at: Mapped[float] = mapped_column(Float)


class SeenFileRow(Base):
    __tablename__ = "seen_files"
    pool_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)


class SeenRowRow(Base):
    __tablename__ = "seen_rows"
    pool_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    digest: Mapped[str] = mapped_column(String(128), primary_key=True)


# The first words of the reason of a file this validator never read (storage unreachable until its
# deadline, validator/judging.py): its batch counter is unknown (`Submissions.unread_before`).
UNFETCHED = "fetch:"


def chain_before(
    t: type[SubmissionRow] | AliasedClass[SubmissionRow],
    block: int | InstrumentedAttribute[int],
    log_index: int | InstrumentedAttribute[int],
    leaf: int | InstrumentedAttribute[int],
) -> ColumnElement[bool]:
    """SQL: the submission row `t` (the table or an alias) came before (block, log index, leaf) in
    chain order; the three may be columns (a correlated comparison) or values."""
    return or_(
        t.block_number < block,
        and_(t.block_number == block, t.log_index < log_index),
        and_(t.block_number == block, t.log_index == log_index, t.leaf < leaf),
    )


MIGRATIONS = Path(__file__).parent / "migrations"
# Not Alembic's default `alembic_version`: a validator may share a PostgreSQL database with the
# orchestrator (no table names collide), whose migrations are another history.
VERSION_TABLE = "validator_alembic_version"


def open_database(url: str | None, data_dir: Path) -> sessionmaker[Session]:
    """`url` (e.g. postgresql+psycopg://…) or SQLite in `data_dir`, its schema brought up to date."""
    if url is None:
        data_dir.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{data_dir / 'validator.db'}"
    engine: Engine = create_engine(url, pool_pre_ping=True)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    migrate(engine)
    return sessionmaker(engine, expire_on_commit=False)


def migrate(engine: Engine) -> None:
    """Alembic, as the orchestrator's database (validator/migrations/): a fresh database gets every
    table, an older one the revisions it lacks; one made before the validator had migrations (its
    schema kept by hand) is taken up by the first revision, which makes only what is missing."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    """WAL and synchronous=NORMAL, as the orchestrator's SQLite: a commit no longer waits for two
    fsyncs (10 % of a devnet validator's CPU went to commits), a crash of the process loses nothing
    committed (only a power cut can take the last transactions), and readers do not block the writer."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


class Database:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        with self.sessions() as session, session.begin():
            yield session


class ChainCursor:
    def __init__(self, db: Database) -> None:
        self.db = db

    def next_block(self, pool_id: int, default: int) -> int:
        with self.db.transaction() as s:
            row = s.get(CursorRow, pool_id)
            return row.next_block if row else default

    def recent_blocks(self, pool_id: int) -> list[tuple[int, str]]:
        with self.db.transaction() as s:
            rows = s.scalars(
                select(BlockRow)
                .where(BlockRow.pool_id == pool_id)
                .order_by(BlockRow.number.desc())
                .limit(KEEP_BLOCKS)
            )
            return [(r.number, r.hash) for r in rows]

    def advance(self, s: Session, pool_id: int, next_block: int, hashes: dict[int, str]) -> None:
        """In the caller's transaction (with the submissions of those blocks)."""
        row = s.get(CursorRow, pool_id)
        if row is None:
            s.add(CursorRow(pool_id=pool_id, next_block=next_block))
        else:
            row.next_block = next_block
        for number, block_hash in hashes.items():
            s.merge(BlockRow(pool_id=pool_id, number=number, hash=block_hash))
        s.execute(
            delete(BlockRow).where(BlockRow.pool_id == pool_id, BlockRow.number < next_block - KEEP_BLOCKS)
        )

    def rewind(self, pool_id: int, to_block: int) -> None:
        """A reorg replaced blocks >= to_block: forget them and what was read from them but not judged."""
        with self.db.transaction() as s:
            s.execute(delete(BlockRow).where(BlockRow.pool_id == pool_id, BlockRow.number >= to_block))
            s.execute(
                delete(SubmissionRow).where(
                    SubmissionRow.pool_id == pool_id,
                    SubmissionRow.block_number >= to_block,
                    SubmissionRow.state == "pending",
                )
            )
            # Votes sent from a replaced block may be gone with it: send them again (idempotent).
            s.execute(
                update(VerdictRow)
                .where(
                    VerdictRow.pool_id == pool_id,
                    VerdictRow.block_number >= to_block,
                    VerdictRow.vote_state == "sent",
                )
                .values(vote_state="pending")
            )
            row = s.get(CursorRow, pool_id)
            if row is not None and row.next_block > to_block:
                row.next_block = to_block


class Submissions:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, s: Session, row: SubmissionRow) -> bool:
        """In the watcher's transaction; False when this work key is already known (re-read after a reorg)."""
        if s.get(SubmissionRow, (row.pool_id, row.work_key)) is not None:
            return False
        s.add(row)
        return True

    def due(self, limit: int = 16) -> list[SubmissionRow]:
        """Pending submissions whose retry time has come, in chain order, each only once every earlier
        submission of its node is judged. A node's files are judged in the order the chain recorded
        them, whatever held one back (storage, a retry): the grinding rule compares each file's batch
        counter with the node's previous file, so judging them out of order would take an honest
        node's pay. A held file waits at most until the one before it gets a verdict, which the
        availability and soft-invalidation windows and the poison limit bound."""
        now = time.time()
        earlier = aliased(SubmissionRow)
        held = exists().where(
            earlier.pool_id == SubmissionRow.pool_id,
            earlier.node == SubmissionRow.node,
            earlier.state == "pending",
            chain_before(earlier, SubmissionRow.block_number, SubmissionRow.log_index, SubmissionRow.leaf),
        )
        with self.db.transaction() as s:
            return list(
                s.scalars(
                    select(SubmissionRow)
                    .where(SubmissionRow.state == "pending", SubmissionRow.next_attempt_at <= now, ~held)
                    .order_by(SubmissionRow.block_number, SubmissionRow.log_index, SubmissionRow.leaf)
                    .limit(limit)
                )
            )

    def unread_before(self, sub: SubmissionRow, last: int = 4) -> int:
        """How many of the node's submissions judged just before `sub` (chain order, since its last file
        that was read; at most `last`) this validator never read because storage stayed unreachable
        (soft-invalidated, reason "fetch:"): their batch counters are unknown, so the grinding rule
        allows that many counters skipped.
        Only that reason counts: a node cannot make a validator's storage unreachable, while a file it
        made too big or impossible to judge would otherwise buy it a skipped counter (a selection)."""
        earlier = chain_before(SubmissionRow, sub.block_number, sub.log_index, sub.leaf)
        with self.db.transaction() as s:
            rows = s.execute(
                select(VerdictRow.verdict, VerdictRow.step, VerdictRow.reasons)
                .join(
                    SubmissionRow,
                    and_(
                        SubmissionRow.pool_id == VerdictRow.pool_id,
                        SubmissionRow.work_key == VerdictRow.work_key,
                    ),
                )
                .where(SubmissionRow.pool_id == sub.pool_id, SubmissionRow.node == sub.node, earlier)
                .order_by(
                    SubmissionRow.block_number.desc(),
                    SubmissionRow.log_index.desc(),
                    SubmissionRow.leaf.desc(),
                )
                .limit(last)
            ).all()
        unread = 0
        for verdict, step, reasons in rows:  # newest first: those since the node's last file read
            first = (json.loads(reasons or "[]") or [""])[0]
            if verdict != "soft_invalidate" or step is not None or not str(first).startswith(UNFETCHED):
                break
            unread += 1
        return unread

    def upcoming(self, limit: int) -> list[SubmissionRow]:
        """Pending submissions whose time has come, in chain order, held or not: what the judge loop
        will want next, for downloading ahead."""
        with self.db.transaction() as s:
            return list(
                s.scalars(
                    select(SubmissionRow)
                    .where(SubmissionRow.state == "pending", SubmissionRow.next_attempt_at <= time.time())
                    .order_by(SubmissionRow.block_number, SubmissionRow.log_index, SubmissionRow.leaf)
                    .limit(limit)
                )
            )

    def pending_count(self) -> int:
        with self.db.transaction() as s:
            return len(
                list(s.scalars(select(SubmissionRow.work_key).where(SubmissionRow.state == "pending")))
            )

    def retry_later(self, pool_id: int, work_key: str, error: str, delay: float) -> int:
        with self.db.transaction() as s:
            row = s.get(SubmissionRow, (pool_id, work_key))
            assert row is not None
            row.attempts += 1
            row.next_attempt_at = time.time() + delay
            row.last_error = error[:2000]
            return row.attempts


class Verdicts:
    def __init__(self, db: Database) -> None:
        self.db = db

    def record(self, sub: SubmissionRow, verdict: Verdict, sha256: str, kept: Path | None, vote: bool) -> int:
        """Store the verdict and mark its submission judged, atomically; returns the verdict id."""
        with self.db.transaction() as s:
            row = s.get(SubmissionRow, (sub.pool_id, sub.work_key))
            if row is None or row.state == "judged":
                existing = s.scalars(
                    select(VerdictRow.id).where(
                        VerdictRow.pool_id == sub.pool_id, VerdictRow.work_key == sub.work_key
                    )
                ).first()
                return int(existing or 0)
            row.state = "judged"
            v = VerdictRow(
                pool_id=sub.pool_id,
                work_key=sub.work_key,
                node=sub.node,
                sha256=sha256,
                verdict=verdict.verdict,
                reasons=json.dumps(verdict.reasons),
                rows=verdict.rows,
                tokens=verdict.tokens,
                step=verdict.step,
                seconds=verdict.seconds,
                timings=json.dumps(verdict.timings),
                judged_by=verdict.judged_by.model_dump_json() if verdict.judged_by else None,
                block_number=sub.block_number,
                file_path=str(kept) if kept else None,
                vote_state="pending" if vote and verdict.verdict != "accept" else "none",
                decided_at=time.time(),
            )
            s.add(v)
            s.flush()
            return int(v.id)

    def votes_due(self) -> list[VerdictRow]:
        with self.db.transaction() as s:
            return list(
                s.scalars(
                    select(VerdictRow).where(VerdictRow.vote_state == "pending").order_by(VerdictRow.id)
                )
            )

    def vote_done(self, verdict_id: int, tx_hash: str | None, error: str | None = None) -> None:
        with self.db.transaction() as s:
            row = s.get(VerdictRow, verdict_id)
            assert row is not None
            row.vote_tx = tx_hash
            row.vote_state = "failed" if error else "sent"
            row.vote_error = error

    def page(
        self, *, pool_id: int | None, node: str | None, after: int, limit: int, accepted_only: bool = False
    ) -> list[VerdictRow]:
        with self.db.transaction() as s:
            q = select(VerdictRow).where(VerdictRow.id > after)
            if pool_id is not None:
                q = q.where(VerdictRow.pool_id == pool_id)
            if node is not None:
                q = q.where(VerdictRow.node == node)
            if accepted_only:
                q = q.where(VerdictRow.verdict == "accept")
            return list(s.scalars(q.order_by(VerdictRow.id).limit(limit)))

    def by_sha256(self, sha256: str) -> VerdictRow | None:
        with self.db.transaction() as s:
            return s.scalars(
                select(VerdictRow).where(VerdictRow.sha256 == sha256, VerdictRow.verdict == "accept")
            ).first()

    def counts(self) -> dict[str, int]:
        with self.db.transaction() as s:
            out: dict[str, int] = {}
            for verdict in s.scalars(select(VerdictRow.verdict)):
                out[verdict] = out.get(verdict, 0) + 1
            return out


class NodeWindowRow(Base):
    """A node's recent per-file statistics (JSON list, oldest first): pooled checks across files."""

    __tablename__ = "node_windows"
    pool_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # a node address, or "<address>#<task id>" for the counter window (checks/history.py): 42 would cut
    # the latter on PostgreSQL (SQLite does not enforce a VARCHAR length)
    node: Mapped[str] = mapped_column(String(256), primary_key=True)
    entries: Mapped[str] = mapped_column(Text, default="[]")


class SqlNodeWindows:
    """`NodeWindows` in the validator's database, so a restart keeps every node's window."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def push(self, pool_id: int | None, node: str, entry: dict[str, Any], keep: int) -> list[dict[str, Any]]:
        with self.db.transaction() as s:
            row = s.get(NodeWindowRow, (pool_id or 0, node.lower()))
            if row is None:
                row = NodeWindowRow(pool_id=pool_id or 0, node=node.lower(), entries="[]")
                s.add(row)
            window = [*json.loads(row.entries), entry][-keep:]
            row.entries = json.dumps(window)
            return window


class SqlSeenStore:
    """The pipeline's duplicate memory, in the validator's database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def file_seen(self, pool_id: int | None, sha256: str) -> bool:
        with self.db.transaction() as s:
            return s.get(SeenFileRow, (pool_id or 0, sha256)) is not None

    def rows_seen(self, pool_id: int | None, row_hashes: list[str]) -> set[str]:
        if not row_hashes:
            return set()
        with self.db.transaction() as s:
            found = s.scalars(
                select(SeenRowRow.digest).where(
                    SeenRowRow.pool_id == (pool_id or 0), SeenRowRow.digest.in_(row_hashes)
                )
            )
            return set(found)

    def remember(self, pool_id: int | None, sha256: str, row_hashes: list[str]) -> None:
        with self.db.transaction() as s:
            s.merge(SeenFileRow(pool_id=pool_id or 0, sha256=sha256))
            for digest in set(row_hashes):
                s.merge(SeenRowRow(pool_id=pool_id or 0, digest=digest))
