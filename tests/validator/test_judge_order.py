"""A node's files are judged in the order the chain recorded them (block, then log index), whatever
held one back. The grinding rule compares each file's batch counter with the node's previous file, so
a file judged ahead of its predecessor (whose download was being retried) took an honest node's pay:
seen twice in the partition run of issue 21. Real SQLite store, real judge loop and fetcher (storage
down = nothing listening), real counter rule."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import sqlalchemy

from intellect.identity import Wallet
from intellect.wire.verdicts import Submission, Verdict
from intellect.workloads import MemoryNodeWindows, MemorySeenStore
from validator.fetch import Fetcher
from validator.judging import JudgeLoop
from validator.store import Database, SubmissionRow, Submissions, Verdicts, open_database
from workloads.inference.judge.checks.context import FileContext
from workloads.inference.judge.checks.history import counter_order
from workloads.inference.judge.thresholds import ValidationThresholds
from workloads.inference.task import TaskSettings
from workloads.model.loading import ModelCheckpoints
from workloads.rollouts import BatchInfo

A, B = "0x" + "aa" * 20, "0x" + "bb" * 20


def key(i: int) -> str:
    return "0x" + f"{i:064x}"


class CounterJudge:
    """Judges by the grinding rule alone: each file's batch counter (here: the file's text) must follow
    the node's previous one, in judging order, as `counter_order` keeps it."""

    def __init__(self) -> None:
        self.windows = MemoryNodeWindows()
        self.order: list[str] = []

    def judge(self, path: Path, submission: Submission) -> Verdict:
        counter = int(path.read_text())
        assert submission.work_key is not None and submission.node is not None
        self.order.append(submission.work_key)
        window = self.windows.push(submission.pool_id, submission.node, {"counter": counter}, keep=2)
        previous = int(window[-2]["counter"]) if len(window) > 1 else 0
        if counter != previous + 1:
            return Verdict(file=str(path), verdict="soft_invalidate", reasons=[f"grinding: {counter}"])
        return Verdict(file=str(path), verdict="accept")


def queue(db: Database, rows: list[tuple[str, str, int, int]], leaves: list[int] | None = None) -> None:
    with db.transaction() as s:
        for i, (work_key, node, block, log_index) in enumerate(rows):
            s.add(SubmissionRow(pool_id=1, work_key=work_key, node=node, provider="0x" + "33" * 20, units=1,
                                block_number=block, log_index=log_index, tx_hash="0x" + "44" * 32,
                                submitted_at=int(time.time()), leaf=leaves[i] if leaves else 0))  # fmt: skip


def test_a_nodes_later_files_wait_for_the_one_whose_download_is_retried(tmp_path: Path) -> None:
    db = Database(open_database(None, tmp_path))
    submissions, verdicts = Submissions(db), Verdicts(db)
    wallet = Wallet.from_key("0x" + "01" * 32)
    fetcher = Fetcher("http://127.0.0.1:9", wallet, tmp_path / "files", max_bytes=1 << 20, timeout=1)
    # A's batches 1, 2, 3; 1 and 2 in one block, where the log index (not the work key) is the order.
    a1, a2, a3, b1 = key(9), key(3), key(7), key(5)
    queue(db, [(a1, A, 10, 4), (a2, A, 10, 6), (b1, B, 10, 5), (a3, A, 11, 0)])
    for work_key, counter in ((a2, 2), (a3, 3), (b1, 1)):  # a1 not downloaded yet: storage is down
        fetcher.path_for(work_key[2:]).write_text(str(counter))
    judge = CounterJudge()
    loop = JudgeLoop(submissions, verdicts, fetcher, judge, fetch_window=600, vote=False, base_delay=0.0)

    loop.run_once()
    judged = {v.work_key: v for v in verdicts.page(pool_id=1, node=None, after=0, limit=10)}
    assert list(judged) == [b1], "only the other node's file may be judged while A's first is retried"
    with db.transaction() as s:  # the retry's time has come (the backoff is tested elsewhere)
        row = s.get(SubmissionRow, (1, a1))
        assert row is not None and row.attempts == 1
        row.next_attempt_at = 0.0
    assert [r.work_key for r in submissions.due()] == [a1]  # A's later files are held, not due

    fetcher.path_for(a1[2:]).write_text("1")  # storage is back
    loop.run_once()
    judged = {v.work_key: v for v in verdicts.page(pool_id=1, node=None, after=0, limit=10)}
    assert judge.order == [b1, a1, a2, a3]  # chain order: (10, 4), (10, 6), (11, 0)
    assert {k: v.verdict for k, v in judged.items()} == dict.fromkeys((a1, a2, a3, b1), "accept")


def test_out_of_order_judging_would_have_taken_the_pay(tmp_path: Path) -> None:
    """The same counters judged in the order the old queue gave (block, then work key) are what the
    rule punishes: the fix is the order, not a looser rule."""
    judge = CounterJudge()
    sub = Submission(node=A, pool_id=1, work_key=key(1))
    verdicts = []
    for counter in (1, 3, 2):
        path = tmp_path / f"{counter}.txt"
        path.write_text(str(counter))
        verdicts.append(judge.judge(path, sub).verdict)
    assert verdicts == ["accept", "soft_invalidate", "soft_invalidate"]


def test_a_database_of_an_older_validator_gets_the_new_column(tmp_path: Path) -> None:
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'validator.db'}")
    with engine.begin() as conn:  # the submissions table as validators before log_index wrote it
        conn.execute(sqlalchemy.text(
            "CREATE TABLE submissions (pool_id INTEGER NOT NULL, work_key VARCHAR(66) NOT NULL, "
            "node VARCHAR(42) NOT NULL, provider VARCHAR(42) NOT NULL, units BIGINT NOT NULL, "
            "block_number BIGINT NOT NULL, tx_hash VARCHAR(66) NOT NULL, submitted_at BIGINT NOT NULL, "
            "trainer_step INTEGER, state VARCHAR(16) NOT NULL, attempts INTEGER NOT NULL, "
            "next_attempt_at FLOAT NOT NULL, last_error TEXT, PRIMARY KEY (pool_id, work_key))"))  # fmt: skip
        conn.execute(sqlalchemy.text(
            f"INSERT INTO submissions VALUES (1, '{key(1)}', '{A}', '{B}', 1, 7, '0x', 0, NULL, 'pending', "
            "0, 0.0, NULL)"))  # fmt: skip
    engine.dispose()
    db = Database(open_database(None, tmp_path))
    due = Submissions(db).due()
    assert [(r.work_key, r.log_index, r.leaf) for r in due] == [(key(1), 0, 0)]
    queue(db, [(key(2), A, 7, 3)])  # and new rows keep their log index
    assert [r.work_key for r in Submissions(db).due()] == [key(1)]  # key(2) waits for key(1)


def test_the_files_of_a_batch_are_judged_in_the_batchs_order(tmp_path: Path) -> None:
    """A batch's files share one log (block and log index): their place in the batch orders them, so a
    file held back holds the batch's later files too, never its earlier ones."""
    db = Database(open_database(None, tmp_path))
    submissions, verdicts = Submissions(db), Verdicts(db)
    wallet = Wallet.from_key("0x" + "01" * 32)
    fetcher = Fetcher("http://127.0.0.1:9", wallet, tmp_path / "files", max_bytes=1 << 20, timeout=1)
    batch = [key(8), key(2), key(6), key(4)]  # counters 1..4 in this order; keys sort otherwise
    queue(db, [(k, A, 20, 3) for k in batch], leaves=[0, 1, 2, 3])
    for counter, work_key in enumerate(batch, start=1):
        if counter != 3:  # the third file's download fails for now
            fetcher.path_for(work_key[2:]).write_text(str(counter))
    judge = CounterJudge()
    loop = JudgeLoop(submissions, verdicts, fetcher, judge, fetch_window=600, vote=False, base_delay=0.0)
    loop.run_once()
    assert judge.order == batch[:2]  # the fourth waits for the third
    with db.transaction() as s:
        row = s.get(SubmissionRow, (1, batch[2]))
        assert row is not None
        row.next_attempt_at = 0.0
    fetcher.path_for(batch[2][2:]).write_text("3")
    loop.run_once()
    assert judge.order == batch
    judged = {v.work_key: v.verdict for v in verdicts.page(pool_id=1, node=None, after=0, limit=10)}
    assert judged == dict.fromkeys(batch, "accept")


class SlowStorage(Fetcher):
    """Files appear after a delay, as from a far-away store; records when each download finished."""

    def __init__(self, *args, counters: dict[str, int], **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.counters = counters
        self.done: dict[str, threading.Event] = {k[2:]: threading.Event() for k in counters}

    def fetch(self, sha256: str) -> Path:
        time.sleep(0.05)
        path = self.path_for(sha256)
        path.write_text(str(self.counters["0x" + sha256]))
        self.done[sha256].set()
        return path


def test_the_next_file_downloads_while_one_is_judged_and_verdicts_keep_chain_order(tmp_path: Path) -> None:
    db = Database(open_database(None, tmp_path))
    submissions, verdicts = Submissions(db), Verdicts(db)
    files = [key(30 + i) for i in range(4)]
    queue(db, [(k, A, 40 + i, 0) for i, k in enumerate(files)])
    counters = {k: i + 1 for i, k in enumerate(files)}
    storage = SlowStorage("http://127.0.0.1:9", Wallet.from_key("0x" + "01" * 32), tmp_path / "files",
                          max_bytes=1 << 20, timeout=1, counters=counters)  # fmt: skip
    seen_ahead: list[bool] = []

    class WaitingJudge(CounterJudge):
        def judge(self, path: Path, submission: Submission) -> Verdict:
            at = files.index(str(submission.work_key))
            if at + 1 < len(files):  # the next download is under way: it finishes while we judge
                seen_ahead.append(storage.done[files[at + 1][2:]].wait(timeout=10))
            return super().judge(path, submission)

    judge = WaitingJudge()
    loop = JudgeLoop(submissions, verdicts, storage, judge, fetch_window=600, vote=False, base_delay=0.0)
    assert loop.run_once() == 4
    assert seen_ahead == [True, True, True]
    assert judge.order == files
    judged = {v.work_key: v.verdict for v in verdicts.page(pool_id=1, node=None, after=0, limit=10)}
    assert judged == dict.fromkeys(files, "accept")


def test_rejected_files_are_kept_as_evidence_and_accepted_ones_are_served(tmp_path: Path) -> None:
    """A file not accepted (here a counter out of order: soft) is moved to the evidence folder, where
    the pool owner can look at it again; an accepted one stays where `GET /files/{sha256}` serves it.
    Without an evidence folder a rejected file is deleted, as before."""
    db = Database(open_database(None, tmp_path))
    submissions, verdicts = Submissions(db), Verdicts(db)
    fetcher = Fetcher("http://127.0.0.1:9", Wallet.from_key("0x" + "01" * 32), tmp_path / "files",
                      max_bytes=1 << 20, timeout=1)  # fmt: skip
    good, gap = key(1), key(2)
    queue(db, [(good, A, 10, 0), (gap, A, 11, 0)])
    fetcher.path_for(good[2:]).write_text("1")
    fetcher.path_for(gap[2:]).write_text("3")  # counter 3 after 1: not paid
    loop = JudgeLoop(submissions, verdicts, fetcher, CounterJudge(), fetch_window=600, vote=False,
                     base_delay=0.0, evidence_dir=tmp_path / "evidence")  # fmt: skip
    assert loop.run_once() == 2
    judged = {v.work_key: v.verdict for v in verdicts.page(pool_id=1, node=None, after=0, limit=10)}
    assert judged == {good: "accept", gap: "soft_invalidate"}
    assert fetcher.path_for(good[2:]).read_text() == "1"
    assert not fetcher.path_for(gap[2:]).exists()
    assert (tmp_path / "evidence" / f"{gap[2:]}.parquet").read_text() == "3"


class OrderJudge:
    """The real grinding rule (`counter_order`) on files holding just their batch counter (step 0)."""

    def __init__(self) -> None:
        self.windows = MemoryNodeWindows()

    def judge(self, path: Path, submission: Submission) -> Verdict:
        assert submission.node is not None and submission.work_key is not None
        counter = int(path.read_text())
        info = BatchInfo(node_address=submission.node, step=0, batch_counter=counter, group_size=1,
                         max_new_tokens=1)  # fmt: skip
        ctx = FileContext(
            path=path, submission=submission, task=TaskSettings(), thresholds=ValidationThresholds(),
            records=[], tokenizer=None, seen=MemorySeenStore(),  # type: ignore[arg-type]
            checkpoints=ModelCheckpoints(), vocab_size=0, sha256=submission.work_key[2:], info=info,
        )  # fmt: skip
        reasons = counter_order(ctx, self.windows)
        kind = "soft_invalidate" if reasons else "accept"
        return Verdict(file=str(path), verdict=kind, reasons=reasons, step=0)


def test_a_file_storage_kept_from_the_validator_may_have_used_the_next_counter(tmp_path: Path) -> None:
    """A's counter 2 could never be fetched (storage unreachable until its deadline: soft, its counter
    unknown). Its counter 3 is paid (before: "grinding: 3 where 2 was due", an honest file unpaid);
    one unknown file allows one skipped counter, not two."""
    db = Database(open_database(None, tmp_path))
    submissions, verdicts = Submissions(db), Verdicts(db)
    fetcher = Fetcher("http://127.0.0.1:9", Wallet.from_key("0x" + "01" * 32), tmp_path / "files",
                      max_bytes=1 << 20, timeout=1)  # fmt: skip
    a1, a2, a3, a4 = key(1), key(2), key(3), key(4)
    queue(db, [(a1, A, 10, 0), (a2, A, 11, 0), (a3, A, 12, 0), (a4, A, 13, 0)])
    for work_key, counter in ((a1, 1), (a3, 3), (a4, 5)):  # a2 is never downloaded: nothing listens
        fetcher.path_for(work_key[2:]).write_text(str(counter))
    with db.transaction() as s:  # submitted long ago: past the point where unreachable turns soft
        for row in s.scalars(sqlalchemy.select(SubmissionRow)):
            row.submitted_at = 0
    loop = JudgeLoop(submissions, verdicts, fetcher, OrderJudge(), fetch_window=60, vote=False,
                     base_delay=0.0)  # fmt: skip
    loop.run_once()
    page = verdicts.page(pool_id=1, node=None, after=0, limit=10)
    judged = {v.work_key: (v.verdict, json.loads(v.reasons)) for v in page}
    assert judged[a2][0] == "soft_invalidate" and judged[a2][1][0].startswith("fetch:")
    assert judged[a1][0] == judged[a3][0] == "accept", judged[a3]
    assert judged[a4][0] == "soft_invalidate" and "where 4 was due" in judged[a4][1][0], judged[a4]
    with db.transaction() as s:
        rows = {k: s.get(SubmissionRow, (1, k)) for k in (a3, a4)}
    assert [submissions.unread_before(r) for r in rows.values() if r] == [1, 0]


def test_a_file_bigger_than_the_validator_reads_uses_its_counter_and_holds_the_next(tmp_path: Path) -> None:
    """Issue 54 (selection): a node that makes its file bigger than the validator reads (the pool's
    storage may take more) once bought a skipped counter with no hold, as if storage had lost the file:
    a way to drop a batch for free. Now the download, from a real HTTP storage on loopback, stops at the
    limit with a verdict of its own ("size:", at once: no retry makes it smaller); it is no unread file,
    so the node's next counter is a gap, held as after a withheld batch. Storage that stays unreachable
    still allows the skip unheld (the test above)."""
    from fastapi import FastAPI
    from fastapi.responses import Response

    from tests.support.testing import ServerThread

    sizes = {}
    storage = FastAPI()

    @storage.get("/storage/files/{sha}")
    def grant(sha: str) -> dict[str, object]:  # the orchestrator's file record (StoredFile)
        return {"sha256": sha, "file_name": f"t/{sha}", "size_bytes": sizes.get(sha, 1), "work_units": 1,
                "node_address": A, "task_id": "t", "url": f"{server.url}/blob/{sha}",
                "expires_at": "2100-01-01T00:00:00Z"}

    @storage.get("/blob/{sha}")
    def blob(sha: str) -> Response:
        return Response(b"1" * sizes.get(sha, 1))

    server = ServerThread(storage).start()
    try:
        db = Database(open_database(None, tmp_path))
        submissions, verdicts = Submissions(db), Verdicts(db)
        fetcher = Fetcher(server.url, Wallet.from_key("0x" + "01" * 32), tmp_path / "files", max_bytes=4096,
                          timeout=5)  # fmt: skip
        a1, a2, a3 = key(1), key(2), key(3)
        queue(db, [(a1, A, 10, 0), (a2, A, 11, 0), (a3, A, 12, 0)])
        sizes[a2[2:]] = 3 * 1024 * 1024  # counter 2: the burnt file
        for work_key, counter in ((a1, 1), (a3, 3)):
            fetcher.path_for(work_key[2:]).write_text(str(counter))
        loop = JudgeLoop(submissions, verdicts, fetcher, OrderJudge(), fetch_window=600, vote=False,
                         base_delay=0.0)  # fmt: skip
        loop.run_once()
        judged = {v.work_key: (v.verdict, json.loads(v.reasons))
                  for v in verdicts.page(pool_id=1, node=None, after=0, limit=10)}  # fmt: skip
        assert judged[a2][0] == "soft_invalidate" and judged[a2][1][0].startswith("size:"), judged[a2]
        assert judged[a1][0] == "accept", judged[a1]
        assert judged[a3][0] == "soft_invalidate" and "where 2 was due" in judged[a3][1][0], judged[a3]
        with db.transaction() as s:
            row = s.get(SubmissionRow, (1, a3))
        assert row is not None and submissions.unread_before(row) == 0
    finally:
        server.stop()
