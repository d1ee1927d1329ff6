"""The worker's record of every file a task announced: one row per file, from the bridge to the chain.

    announced ──upload──▶ uploaded ──intent──▶ sending ──tx──▶ submitted
        └──────────────────────┴───────────────────┴──────▶ refused (with the reason)

- **announced**: the bridge checked it (inside the task's data dir, its sha256 matches) and wrote it
  here before answering the task, so a worker restart never loses an announced file.
- **uploaded**: the orchestrator's storage holds it (`upload_ref`: its name there).
- **sending**: the uploader's intent to `submitWork`, written before the transaction leaves: a file
  left here by a crash was *maybe* sent, and the chain is asked before anything is sent again.
  `attempts` counts these intents.
- **submitted**: on chain for this node (`tx_hash`; "" when on chain but its transaction was not found).
- **refused**: can never succeed (the orchestrator refused it for good, zero work units, the key is
  another node's); `reason` says why, and it is never retried.

The sha256 is the on-chain work key, so it is unique: the same content announced twice is one file.
The bridge adds files (`add`); the uploader (worker/uploader.py) moves them on; nothing else writes.

Before this module a file lived twice, in the bridge's queue (`files`: announced, uploaded,
submitted) and the uploader's journal (`uploader.sqlite`: sending, submitted, rejected), both with
the tx hash. `WorkerFiles` upgrades the old queue in place when it opens it (same file, same ids), and
`merge_journal` folds an old journal in, moving a state only forward, so a merge that is interrupted
and run again changes nothing. The worker does both on start (`worker.runtime.start_runtime`).
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

import structlog
from pydantic import BaseModel

from worker.sqlite import transaction

log = structlog.get_logger(__name__)

FILES_DB = "files.sqlite"  # in the bridge's folder, `<state_dir>/bridge/`
LEGACY_JOURNAL = "uploader.sqlite"  # in `<state_dir>/`, read once by `merge_journal`
SCHEMA_VERSION = 1  # PRAGMA user_version; the queue before the one record had none (0)


class FileState(StrEnum):
    ANNOUNCED = "announced"
    UPLOADED = "uploaded"
    SENDING = "sending"
    SUBMITTED = "submitted"
    REFUSED = "refused"


# How far along a state is: a merge never moves a file back.
_RANK = {FileState.ANNOUNCED: 0, FileState.UPLOADED: 1, FileState.SENDING: 2, FileState.SUBMITTED: 3,
         FileState.REFUSED: 3}  # fmt: skip


class WorkerFile(BaseModel):
    """One announced file and how far it got."""

    id: int
    task_id: str
    path: Path
    relative_path: str
    sha256: str
    work_units: int
    size_bytes: int
    state: FileState
    attempts: int = 0
    reason: str | None = None
    announced_at: datetime
    uploaded_at: datetime | None = None
    upload_ref: str | None = None
    submitted_at: datetime | None = None
    tx_hash: str | None = None
    updated_at: datetime | None = None


_COLUMNS = [
    "id", "task_id", "path", "relative_path", "sha256", "work_units", "size_bytes", "state", "attempts",
    "reason", "announced_at", "uploaded_at", "upload_ref", "submitted_at", "tx_hash", "updated_at",
]  # fmt: skip

_CREATE = (
    "CREATE TABLE IF NOT EXISTS files ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL, path TEXT NOT NULL,"
    " relative_path TEXT NOT NULL,"
    # One work key per file on chain: the same content announced twice is one entry.
    " sha256 TEXT NOT NULL UNIQUE, work_units INTEGER NOT NULL, size_bytes INTEGER NOT NULL,"
    " announced_at TEXT NOT NULL, uploaded_at TEXT, upload_ref TEXT, submitted_at TEXT, tx_hash TEXT,"
    # The columns the one record added, last, as the upgrade of an old queue adds them.
    " state TEXT NOT NULL DEFAULT 'announced', attempts INTEGER NOT NULL DEFAULT 0, reason TEXT,"
    " updated_at TEXT)"
)
_ADDED = ("state TEXT NOT NULL DEFAULT 'announced'", "attempts INTEGER NOT NULL DEFAULT 0", "reason TEXT",
          "updated_at TEXT")  # fmt: skip
# An old queue knew three things; the journal (merged next) knows the rest. A file the old uploader
# refused after its upload was marked submitted with tx "": it stays `submitted` only if no journal
# says otherwise, as before it never left the queue again.
_STATE_OF_OLD_ROW = ("UPDATE files SET state = CASE WHEN submitted_at IS NOT NULL THEN 'submitted'"
                     " WHEN uploaded_at IS NOT NULL THEN 'uploaded' ELSE 'announced' END")  # fmt: skip


def _now() -> str:
    return datetime.now(UTC).isoformat()


class WorkerFiles:
    """The record (SQLite, one connection per call: safe across threads and processes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with transaction(path) as db:
            db.execute("PRAGMA journal_mode=WAL")
        self._upgrade()

    def _upgrade(self) -> None:
        """Create the table, or add the record's columns to a queue made before it (one transaction:
        a crash leaves the old queue or the new record, never half of one)."""
        with transaction(self.path) as db:
            db.execute("BEGIN IMMEDIATE")  # another process opening the same file waits, then sees it done
            if db.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
                return
            columns = {row[1] for row in db.execute("PRAGMA table_info(files)")}
            if not columns:
                db.execute(_CREATE)
            elif "state" not in columns:
                for column in _ADDED:
                    db.execute(f"ALTER TABLE files ADD COLUMN {column}")
                db.execute(_STATE_OF_OLD_ROW)
                log.info("worker file queue upgraded to the one file record", path=str(self.path))
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _rows(self, where: str, *args: object) -> list[WorkerFile]:
        with transaction(self.path) as db:
            rows = db.execute(f"SELECT {', '.join(_COLUMNS)} FROM files WHERE {where} ORDER BY id",
                              args).fetchall()  # fmt: skip
        return [WorkerFile.model_validate(dict(zip(_COLUMNS, row, strict=True))) for row in rows]

    def _set(self, file_id: int, assignments: str, *args: object) -> WorkerFile:
        with transaction(self.path) as db:
            db.execute(f"UPDATE files SET {assignments}, updated_at = ? WHERE id = ?",
                       (*args, _now(), file_id))
        return self.get(file_id)

    # ---- reading ----

    def get(self, file_id: int) -> WorkerFile:
        rows = self._rows("id = ?", file_id)
        if not rows:
            raise KeyError(f"no announced file with id {file_id}")
        return rows[0]

    def find(self, sha256: str) -> WorkerFile | None:
        rows = self._rows("sha256 = ?", sha256)
        return rows[0] if rows else None

    def all(self) -> list[WorkerFile]:
        return self._rows("1 = 1")

    def pending_upload(self) -> list[WorkerFile]:
        return self._rows("state = ?", FileState.ANNOUNCED.value)

    def pending_submission(self) -> list[WorkerFile]:
        """Uploaded files not on chain yet, `sending` ones (maybe sent) included: the uploader asks."""
        return self._rows("state IN (?, ?)", FileState.UPLOADED.value, FileState.SENDING.value)

    # ---- writing: the bridge ----

    def add(self, task_id: str, path: Path, relative_path: str, sha256: str, work_units: int,
            size_bytes: int) -> tuple[WorkerFile, bool]:  # fmt: skip
        """Record an announced file; (record, False) when the same content was already announced."""
        now = _now()
        with transaction(self.path) as db:
            cursor = db.execute(
                "INSERT OR IGNORE INTO files (task_id, path, relative_path, sha256, work_units, size_bytes,"
                " announced_at, state, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (task_id, str(path), relative_path, sha256, work_units, size_bytes, now,
                 FileState.ANNOUNCED.value, now),
            )  # fmt: skip
            created = cursor.rowcount == 1
        found = self.find(sha256)
        assert found is not None
        return found, created

    # ---- writing: the uploader ----

    def mark_uploaded(self, file_id: int, upload_ref: str | None = None) -> WorkerFile:
        return self._set(file_id, "uploaded_at = COALESCE(uploaded_at, ?), upload_ref = ?,"
                         " state = CASE WHEN state = 'announced' THEN 'uploaded' ELSE state END",
                         _now(), upload_ref)  # fmt: skip

    def mark_sending(self, file_id: int) -> WorkerFile:
        """The intent, written before a transaction that carries the file leaves."""
        return self._set(file_id, "state = ?, attempts = attempts + 1", FileState.SENDING.value)

    def mark_submitted(self, file_id: int, tx_hash: str) -> WorkerFile:
        """On chain for this node; `tx_hash` "" when its transaction was not found (a known one is kept)."""
        return self._set(file_id, "state = ?, submitted_at = COALESCE(submitted_at, ?),"
                         " tx_hash = COALESCE(NULLIF(?, ''), tx_hash, '')",
                         FileState.SUBMITTED.value, _now(), tx_hash)  # fmt: skip

    def mark_refused(self, file_id: int, reason: str) -> WorkerFile:
        return self._set(file_id, "state = ?, reason = ?", FileState.REFUSED.value, reason)

    # ---- the uploader's journal of a worker from before the one record ----

    def merge_journal(self, journal: Path) -> int:
        """Fold an old uploader journal into the record, then rename it `<name>.merged` (kept, never
        deleted): each file's intent (`sending`), transaction and refusal with its reason and attempts.
        Returns the number of files it moved. Opened read-write so that a journal a crash left with
        its write-ahead log is read whole (and checkpointed) first."""
        if not journal.is_file():
            return 0
        with transaction(journal) as old:
            rows = old.execute(
                "SELECT sha256, state, attempts, tx_hash, reason, updated_at FROM submissions"
            ).fetchall()
        moved, orphans = 0, 0
        with transaction(self.path) as db:
            for sha256, state, attempts, tx_hash, reason, updated_at in rows:
                found = db.execute("SELECT id, state, tx_hash FROM files WHERE sha256 = ?",
                                   (sha256,)).fetchone()
                if found is None:
                    orphans += 1
                    continue
                moved += _merge_row(db, found, state, attempts, tx_hash, reason, updated_at)
        journal.replace(journal.with_name(journal.name + ".merged"))
        log.info("uploader journal merged into the worker's file record", journal=str(journal),
                 files=len(rows), moved=moved, without_a_file=orphans)  # fmt: skip
        return moved


def _merge_row(db: sqlite3.Connection, found: tuple[int, str, str | None], state: str, attempts: int,
               tx_hash: str | None, reason: str | None, updated_at: str | None) -> int:  # fmt: skip
    """One journal row onto its file: 1 when the file's state moved, 0 when it was already as far."""
    file_id, current, known_tx = found[0], FileState(found[1]), found[2]
    target = {"sending": FileState.SENDING, "submitted": FileState.SUBMITTED}.get(state, FileState.REFUSED)
    if target == FileState.REFUSED and current == FileState.SUBMITTED and known_tx:
        target = current  # an old refusal never undoes a transaction the queue recorded
    at = updated_at or _now()
    db.execute("UPDATE files SET attempts = MAX(attempts, ?) WHERE id = ?", (int(attempts or 0), file_id))
    if _RANK[target] < _RANK[current] or (target == current and current != FileState.SUBMITTED):
        return 0
    if target == FileState.SUBMITTED:
        db.execute("UPDATE files SET state = ?, submitted_at = COALESCE(submitted_at, ?),"
                   " tx_hash = COALESCE(NULLIF(tx_hash, ''), ?, ''), updated_at = ? WHERE id = ?",
                   (target.value, at, tx_hash, at, file_id))  # fmt: skip
        return int(current != target)
    if target == FileState.REFUSED:  # the old queue marked a refused file submitted with tx "": undone
        db.execute("UPDATE files SET state = ?, reason = ?, submitted_at = NULL, tx_hash = NULL,"
                   " updated_at = ? WHERE id = ?", (target.value, reason, at, file_id))  # fmt: skip
        return 1
    db.execute("UPDATE files SET state = ?, updated_at = ? WHERE id = ?", (target.value, at, file_id))
    return 1
