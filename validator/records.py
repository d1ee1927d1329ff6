"""What the orchestrator knows of each submitted file, asked once per file.

The chain records only (node, work key, units). The rest is in the orchestrator's upload record,
which the node signed when it asked to upload that file for that task: where the file is stored and
which task it belongs to. `GET /storage/files/{sha256}` answers both (`StoredFile`: the task id and an
expiring download URL), so one call per file serves the download (validator/fetch.py) and the task's
plug-in (validator/tasks.py). The fetch asks first and the task id is remembered here, so the judge
finds it without asking again; tasks themselves never change and are cached by id in `TaskBook`.

Every request goes through the one orchestrator client (`intellect.client.OrchestratorClient`),
signed by this validator's key (the orchestrator lets addresses with the on-chain validator role
read file records and tasks), one try each: the judge loop's backoff is the retry.

The fetcher is built by the service and the task book by the judge factory, each from (orchestrator
URL, wallet); `for_orchestrator` hands both the same `FileRecords` for the same pair.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from intellect.client import OrchestratorClient
from intellect.identity import Wallet
from intellect.wire.storage import StoredFile
from intellect.wire.tasks import Task

REMEMBERED = 4096  # task ids kept by file: far more than the files fetched ahead of their verdicts


class FileRecords:
    """One orchestrator, as this validator sees it: each file's record, and tasks by id."""

    def __init__(self, client: OrchestratorClient, *, remembered: int = REMEMBERED) -> None:
        self.client = client
        self.remembered = remembered
        self._task_ids: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, sha256: str, timeout: float | None = None) -> StoredFile:
        """The file's record with a fresh download URL (raises `TaskApiError`, or `ValueError` when
        the answer is not a file record)."""
        stored = self.client.stored_file(sha256, timeout=timeout)
        with self._lock:
            self._task_ids[sha256] = stored.task_id
            self._task_ids.move_to_end(sha256)
            while len(self._task_ids) > self.remembered:
                self._task_ids.popitem(last=False)
        return stored

    def task_id(self, sha256: str) -> str:
        """The task the file was uploaded for: remembered from its fetch, else asked."""
        with self._lock:
            known = self._task_ids.get(sha256)
        return known if known is not None else self.record(sha256).task_id

    def task(self, task_id: str) -> Task:
        """A task, deleted ones included (a file outlives its run)."""
        return self.client.get(task_id, include_deleted=True)


_shared: dict[tuple[str, str], FileRecords] = {}
_shared_lock = threading.Lock()


def for_orchestrator(url: str, wallet: Wallet, timeout: float = 30.0) -> FileRecords:
    """This process's `FileRecords` for the orchestrator at `url` as `wallet` (built on first use)."""
    key = (url.rstrip("/"), wallet.address)
    with _shared_lock:
        if key not in _shared:
            _shared[key] = FileRecords(OrchestratorClient(url, wallet=wallet, timeout=timeout, retries=1))
        return _shared[key]
