"""The worker's durable state: one JSON file, written atomically, so a restart resumes where it was."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field

from intellect.wire.heartbeat import TaskStatus


class SubmittedWork(BaseModel):
    work_key: str
    pool_id: int
    work_units: int
    tx_hash: str | None = None
    submitted_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


class WorkerState(BaseModel):
    """What must survive a restart. Keys live in keystores next to this file, never in it."""

    version: int = 1
    provider_address: str | None = None
    node_address: str | None = None
    provider_registered: bool = False
    node_added: bool = False
    registration_txs: list[str] = Field(default_factory=list)
    pool_id: int | None = None
    pool_joined: bool = False
    join_tx: str | None = None
    orchestrator_url: str | None = None
    last_task: TaskStatus | None = None
    submitted_work: list[SubmittedWork] = Field(default_factory=list)
    updated_at: datetime | None = None


class StateStore:
    """Load/save `WorkerState`; saves go to a temp file in the same dir, fsync, then rename."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def load(self) -> WorkerState:
        if not self.path.exists():
            return WorkerState()
        try:
            return WorkerState.model_validate_json(self.path.read_text())
        except ValueError as exc:
            raise ValueError(f"corrupt worker state file {self.path}: {exc}; "
                             "move it away to start over") from None

    def save(self, state: WorkerState) -> None:
        state.updated_at = datetime.now(UTC)
        blob = state.model_dump_json(indent=2)
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".state-", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w") as fh:
                    fh.write(blob)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            # Make the rename itself durable.
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def update(self, **changes: object) -> WorkerState:
        """Read-modify-write in one step."""
        state = self.load()
        for key, value in changes.items():
            setattr(state, key, value)
        self.save(state)
        return state


def state_as_json(state: WorkerState) -> dict:
    return json.loads(state.model_dump_json())
