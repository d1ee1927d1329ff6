"""The worker's small local databases (the bridge's file queue, the uploader's submissions): one
short connection per operation, committed or rolled back as a whole, never shared across threads."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def transaction(path: str | Path) -> Iterator[sqlite3.Connection]:
    """A connection for one transaction (waits up to 30 s for another process's write lock)."""
    db = sqlite3.connect(path, timeout=30)
    try:
        with db:
            yield db
    finally:
        db.close()
