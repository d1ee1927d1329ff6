"""`UploadStore`: the only writer of `uploads` (one row per file content) and `file_counters`.

The rules of a grant (who may upload what, the file name template, the signed URL) are the upload
service's (`orchestrator/uploads.py`); what must hold in SQL, whatever the caller, is kept here, each in
one transaction:
- one file content (sha256, the on-chain work key) has one row: the same node asking again gets the
  same row back (a fresh expiry once the old one passed), another node is refused, a completed file
  is refused (nothing left to PUT);
- `${CURRENT_FILE_INDEX}` counts each node's files per task, read and moved under a row lock
  (`BEGIN IMMEDIATE` on SQLite, `FOR UPDATE` on PostgreSQL: orchestrator/db.py), so two concurrent
  grants never share an index, and no two rows share a storage key.

Storage is the witness of an upload the orchestrator was not told of (S3 sends no callback): the
caller passes `stored`, which says whether storage holds a row's file as granted, and such a row is
marked completed when next read.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from intellect.wire.storage import UploadRequest
from orchestrator.models import FileCounterRow, UploadRow, utcnow
from orchestrator.store.nodes import audit

GRANTED, COMPLETED = "granted", "completed"

# Does storage hold this row's file, with the granted size and sha256?
Witness = Callable[[UploadRow], bool]
# The storage key of the node's file number `index` for this task; raises `UnusableName`.
NameFor = Callable[[int], str]


class UploadConflict(Exception):
    """The request collides with a row already there (the API answers 409 with this reason)."""


class UnusableName(Exception):
    """The task's file name template gives no usable key for this file (the API answers 422)."""


class UploadStore:
    """Sync methods: the upload service runs them in a thread."""

    def __init__(self, sessions: Callable[[], Session]) -> None:
        self.sessions = sessions

    def grant(self, node: str, request: UploadRequest, name_for: NameFor, expires: datetime,
              stored: Witness) -> UploadRow:  # fmt: skip
        """The row `node` may PUT `request`'s file under: the one already granted for this content, or a
        new one named by `name_for` with the node's next file index for the task."""
        with self.sessions() as session, session.begin():
            existing = session.scalars(select(UploadRow).where(UploadRow.sha256 == request.sha256)).first()
            if existing is not None:
                return self._again(session, existing, node, request, expires, stored)
            counter = session.get(FileCounterRow, (node, request.task_id), with_for_update=True)
            if counter is None:
                counter = FileCounterRow(node_address=node, task_id=request.task_id, count=0)
                session.add(counter)
            key = name_for(counter.count)
            if session.scalars(select(UploadRow.id).where(UploadRow.key == key)).first() is not None:
                raise UploadConflict(f"file name {key!r} is already taken: the task's file_name_template "
                                     "must make names unique (use ${CURRENT_FILE_INDEX} or ${ORIGINAL_NAME})")
            row = UploadRow(id=str(uuid.uuid4()), node_address=node, task_id=request.task_id, key=key,
                            sha256=request.sha256, size=request.size_bytes, work_units=request.work_units,
                            file_index=counter.count, state=GRANTED, expires_at=expires, created_at=utcnow())
            counter.count += 1
            session.add(row)
            audit(session, node, "upload_granted", row.id, key=key, sha256=request.sha256,
                  size=request.size_bytes)
            return row

    def _again(self, session: Session, row: UploadRow, node: str, request: UploadRequest,
               expires: datetime, stored: Witness) -> UploadRow:  # fmt: skip
        if row.node_address != node:
            raise UploadConflict(f"a file with sha256 {request.sha256} was already uploaded by another node: "
                                 "its work key is taken")
        if row.state != COMPLETED and stored(row):
            _complete(session, row)
        if row.state == COMPLETED:
            raise UploadConflict(f"already uploaded as {row.key}: nothing to upload")
        asked = (request.size_bytes, request.work_units, request.task_id)
        if (row.size, row.work_units, row.task_id) != asked:
            raise UploadConflict(f"sha256 {request.sha256} was granted with a different size, work units or "
                                 "task: request it exactly as before")
        if row.expires_at <= utcnow():
            row.expires_at = expires
        return row

    def complete(self, upload_id: str, sha256: str) -> None:
        """Storage says the upload `upload_id` arrived with content `sha256` (the local disk's callback);
        a row already completed, or granted for other content, is left as it is."""
        with self.sessions() as session, session.begin():
            row = session.get(UploadRow, upload_id)
            if row is not None and row.state != COMPLETED and row.sha256 == sha256:
                _complete(session, row)

    def find(self, sha256: str, stored: Witness) -> UploadRow | None:
        """The row of this content (granted or completed), marked completed first when storage holds it."""
        with self.sessions() as session, session.begin():
            row = session.scalars(select(UploadRow).where(UploadRow.sha256 == sha256)).first()
            if row is not None and row.state != COMPLETED and stored(row):
                _complete(session, row)
            return row


def _complete(session: Session, row: UploadRow) -> None:
    row.state, row.completed_at = COMPLETED, utcnow()
    audit(session, row.node_address, "upload_completed", row.id, key=row.key, sha256=row.sha256)
