"""One file costs the validator one call to the orchestrator: `GET /storage/files/{sha256}` answers
the download URL and the task id together, and the fetch and the judge share that answer (before,
each asked for it). Tasks are read once per task. A stub orchestrator counts what it is asked."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import Response

from intellect.identity import Wallet
from intellect.wire.storage import StoredFile
from intellect.wire.tasks import Task, TaskSpec
from tests.support.testing import ServerThread
from validator.fetch import Fetcher
from validator.tasks import TaskBook

FILES = {"aa" * 32: "task-1", "bb" * 32: "task-1", "cc" * 32: "task-2"}


def test_a_file_costs_one_call_and_a_task_one_read(tmp_path: Path) -> None:
    asked: Counter[str] = Counter()
    app = FastAPI()

    @app.get("/storage/files/{sha}")
    def record(sha: str) -> StoredFile:
        asked["record"] += 1
        return StoredFile(sha256=sha, file_name=f"{FILES[sha]}/{sha}", size_bytes=4, work_units=1,
                          node_address="0x" + "aa" * 20, task_id=FILES[sha], url=f"{server.url}/blob/{sha}",
                          expires_at=datetime.now(UTC) + timedelta(minutes=5))  # fmt: skip

    @app.get("/tasks/{task_id}")
    def task(task_id: str, include_deleted: bool = False) -> Task:
        asked["task"] += 1
        assert include_deleted  # a file outlives its run
        return Task(id=task_id, spec=TaskSpec(name=task_id, image="i"), created_at=datetime.now(UTC))

    @app.get("/blob/{sha}")
    def blob(sha: str) -> Response:
        asked["download"] += 1
        return Response(b"data")

    server = ServerThread(app).start()
    try:
        wallet = Wallet.create()
        fetcher = Fetcher(server.url, wallet, tmp_path / "files", max_bytes=1 << 20, timeout=5)
        book = TaskBook(server.url, wallet)
        for sha, task_id in FILES.items():  # as the judge loop does: fetch, then judge by its task
            assert fetcher.fetch(sha).read_bytes() == b"data"
            assert book.task_of("0x" + sha).id == task_id
        assert asked == {"record": 3, "download": 3, "task": 2}
        assert TaskBook(server.url, wallet).task_of("aa" * 32).id == "task-1"  # the judge factory's own book
        assert asked["record"] == 3  # shares the fetch's records: nothing asked again
        # a file already on disk when the process started (no fetch this time): the judge's one call
        restarted = TaskBook(server.url, Wallet.create())
        assert restarted.task_of("bb" * 32).id == "task-1" and asked["record"] == 4
    finally:
        server.stop()
