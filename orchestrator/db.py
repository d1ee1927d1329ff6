"""Engine, sessions and Alembic migrations (run at start: a fresh or old database is brought up to date)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry

MIGRATIONS = Path(__file__).parent / "migrations"


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        return _sqlite_engine(url)
    return create_engine(url, pool_pre_ping=True)


def _sqlite_engine(url: str) -> Engine:
    """SQLite with real transactions.

    Python's sqlite3 driver opens a transaction only at the first write, so a read-then-write such as
    the upload grant's `SELECT ... FOR UPDATE` of the file counter (FOR UPDATE means nothing to SQLite)
    ran its read outside the transaction and two concurrent grants got the same file index. Every
    transaction here starts with `BEGIN IMMEDIATE` instead: writers queue on the database lock (up to
    `timeout`), readers outside a transaction still read concurrently under WAL.
    """
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
        if isinstance(dbapi_connection, sqlite3.Connection):
            dbapi_connection.isolation_level = None  # the driver's own BEGIN off: `_begin` opens them
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def migrate(engine: Engine) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
