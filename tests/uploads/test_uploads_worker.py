"""The worker's uploader against a real orchestrator, storage and anvil: upload, then `submitWork`
exactly once per file, also across a crash between sending the transaction and recording it; batched,
one `submitWorkBatch` per full (or old enough) batch, with the same guarantees."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import httpx
import pytest
from uploads_world import Orchestrator, joined_nodes, make_healthy

from intellect.identity import Wallet
from ledger.events import EventReader
from worker.files import WorkerFiles
from worker.uploader import LedgerWork, Uploader


@pytest.fixture(scope="module")
def world(devnet, redis_url, tmp_path_factory):
    orch = Orchestrator(devnet, redis_url, tmp_path_factory.mktemp("orch"), upload_max_bytes=1 << 20).start()
    provider = devnet.new_provider()
    nodes = joined_nodes(devnet, 3, provider)
    make_healthy(orch, nodes)
    task = orch.create_task({"name": "rollouts", "image": "i"})
    for node in nodes:
        assert orch.assigned(node)["task"]["id"] == task
    yield orch, provider, nodes, task
    orch.stop()


class CountingWork(LedgerWork):
    """The real ledger path, counting sends; `crash_after_send` dies right after the tx is mined."""

    def __init__(self, *args, crash_after_send: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent = 0
        self.batches: list[int] = []  # files per batch sent
        self.crash = crash_after_send

    def submit(self, work_key: str, units: int) -> str:
        tx = super().submit(work_key, units)
        self.sent += 1
        if self.crash:
            raise KeyboardInterrupt("worker killed after sending")
        return tx

    def submit_batch(self, files: list[tuple[str, int]]) -> str:
        tx = super().submit_batch(files)
        self.batches.append(len(files))
        if self.crash:
            raise KeyboardInterrupt("worker killed after sending")
        return tx


def add_file(queue: WorkerFiles, data_dir: Path, task: str, name: str, data: bytes, units: int = 4):
    path = data_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    entry, _ = queue.add(task, path, name, hashlib.sha256(data).hexdigest(), units, len(data))
    return entry


def uploader(orch, devnet, provider, node, state: Path, *, batch_files: int = 1, batch_age: float = 30.0,
             **kw) -> tuple[Uploader, CountingWork, WorkerFiles]:  # fmt: skip
    queue = WorkerFiles(state / "bridge" / "files.sqlite")
    work = CountingWork(devnet.client(provider), devnet.pool_id, node.address, **kw)
    up = Uploader(node, queue, work, lambda: orch.url, backoff=0.05, batch_files=batch_files,
                  batch_age=batch_age)  # fmt: skip
    return up, work, queue


def submissions(devnet, key: str) -> list:
    reader = EventReader(devnet.client(), pool_id=devnet.pool_id, kinds=("WorkSubmitted",))
    return [e for e in reader.read(devnet.deployment.block).events if e.work_key == "0x" + key]


def test_upload_then_submit_once(world, devnet, tmp_path) -> None:
    orch, provider, nodes, task = world
    node = nodes[0]
    up, work, queue = uploader(orch, devnet, provider, node, tmp_path)
    files = [add_file(queue, tmp_path / "data", task, f"rollouts/step-{i}.parquet", os.urandom(5000 + i))
             for i in range(2)]
    report = up.run_once()
    assert sorted(report.uploaded) == sorted(f.sha256 for f in files)
    assert sorted(report.submitted) == sorted(f.sha256 for f in files)
    for f in files:
        on_chain = devnet.client().get_work(devnet.pool_id, "0x" + f.sha256)
        assert on_chain is not None and on_chain.node == node.address and on_chain.units == 4
        events = submissions(devnet, f.sha256)
        assert len(events) == 1 and queue.get(f.id).tx_hash == events[0].tx_hash
        stored = orch.admin("GET", f"/storage/files/{f.sha256}").json()
        assert hashlib.sha256(httpx.get(stored["url"]).content).hexdigest() == f.sha256
        assert queue.get(f.id).upload_ref == stored["file_name"]
    # nothing left, nothing sent twice
    assert up.run_once().submitted == [] and work.sent == 2
    assert queue.pending_upload() == [] and queue.pending_submission() == []


def test_crash_after_send_does_not_resubmit(world, devnet, tmp_path) -> None:
    orch, provider, nodes, task = world
    node = nodes[1]
    first, work, queue = uploader(orch, devnet, provider, node, tmp_path, crash_after_send=True)
    f = add_file(queue, tmp_path / "data", task, "out.parquet", os.urandom(4000))
    with pytest.raises(KeyboardInterrupt):
        first.run_once()
    assert work.sent == 1 and queue.get(f.id).submitted_at is None  # sent, but not recorded
    # a new worker process on the same state: the intent says "maybe sent", the chain says it is there
    second, work2, queue2 = uploader(orch, devnet, provider, node, tmp_path)
    report = second.run_once()
    assert report.submitted == [f.sha256] and work2.sent == 0
    events = submissions(devnet, f.sha256)
    assert len(events) == 1 and queue2.get(f.id).tx_hash == events[0].tx_hash


def test_own_duplicate_is_success_and_foreign_key_is_rejected(world, devnet, tmp_path) -> None:
    orch, provider, nodes, task = world
    node, other = nodes[2], nodes[0]
    up, work, queue = uploader(orch, devnet, provider, node, tmp_path)
    # submitted on chain earlier by this node (say its file record was lost with a disk): the revert
    # WorkAlreadySubmitted for our own key counts as success, with the original transaction
    mine = add_file(queue, tmp_path / "data", task, "mine.bin", os.urandom(3000))
    tx = devnet.client(provider).submit_work(devnet.pool_id, node.address, "0x" + mine.sha256, 4).tx_hash
    # the same content already submitted by another node: never ours, rejected with the reason
    theirs = add_file(queue, tmp_path / "data", task, "theirs.bin", os.urandom(3000))
    devnet.client(provider).submit_work(devnet.pool_id, other.address, "0x" + theirs.sha256, 4)
    # zero work units: stored, but the contract refuses zero units; not sent
    zero = add_file(queue, tmp_path / "data", task, "zero.bin", os.urandom(3000), units=0)
    report = up.run_once()
    assert set(report.uploaded) == {mine.sha256, theirs.sha256, zero.sha256}
    assert report.submitted == [mine.sha256] and queue.get(mine.id).tx_hash == tx
    assert set(report.rejected) == {theirs.sha256, zero.sha256}
    assert "another" not in (queue.get(mine.id).reason or "")
    assert other.address in (queue.get(theirs.id).reason or "")
    # the attempt reverted at gas estimation: nothing was mined for it
    assert len(submissions(devnet, mine.sha256)) == 1 and work.sent == 0
    assert up.run_once().rejected == [] and work.sent == 0  # rejected files are not retried


def test_refused_upload_is_not_retried_and_unknown_node_waits(world, devnet, tmp_path) -> None:
    orch, provider, nodes, task = world
    up, work, queue = uploader(orch, devnet, provider, nodes[0], tmp_path)
    big = add_file(queue, tmp_path / "data", task, "big.bin", os.urandom((1 << 20) + 1))
    report = up.run_once()
    assert report.rejected == [big.sha256] and "upload_max_bytes" in (queue.get(big.id).reason or "")
    assert queue.get(big.id).uploaded_at is None and work.sent == 0
    # a node the orchestrator does not know (yet): 404, kept for later
    stranger, _, q2 = uploader(orch, devnet, provider, Wallet.create(), tmp_path / "s")
    f = add_file(q2, tmp_path / "s" / "data", task, "a.bin", b"abc")
    assert stranger.run_once().retry_later == [f.sha256]


def test_a_batch_goes_out_when_full_or_when_its_oldest_file_waited_enough(world, devnet, tmp_path) -> None:
    orch, provider, nodes, task = world
    node = nodes[0]
    up, work, queue = uploader(orch, devnet, provider, node, tmp_path, batch_files=3, batch_age=1.0)
    data = tmp_path / "data"
    files = [add_file(queue, data, task, f"b/{i}.bin", os.urandom(2000 + i), units=i + 1) for i in range(2)]
    report = up.run_once()
    assert sorted(report.uploaded) == sorted(f.sha256 for f in files)
    assert report.submitted == [] and work.batches == []  # two of three, and young: they wait
    files.append(add_file(queue, data, task, "b/2.bin", os.urandom(2002), units=3))
    report = up.run_once()
    assert report.submitted == [f.sha256 for f in files] and work.batches == [3] and work.sent == 0
    txs = {queue.get(f.id).tx_hash for f in files}
    assert len(txs) == 1
    tx = txs.pop()
    for i, f in enumerate(files):  # each file its own event, in upload order, with its own units
        events = submissions(devnet, f.sha256)
        assert [(e.tx_hash, e.units, e.leaf, e.node) for e in events] == [(tx, i + 1, i, node.address)]
    # one more file, alone: it goes out once it has waited batch_age, in a batch of one
    last = add_file(queue, data, task, "b/3.bin", os.urandom(2003))
    assert up.run_once().submitted == [] and work.batches == [3]
    time.sleep(1.1)
    assert up.run_once().submitted == [last.sha256] and work.batches == [3, 1]
    assert queue.pending_submission() == [] and up.run_once().submitted == []


def test_a_crash_after_sending_a_batch_neither_loses_nor_recounts_a_file(world, devnet, tmp_path) -> None:
    orch, provider, nodes, task = world
    node = nodes[1]
    first, work, queue = uploader(orch, devnet, provider, node, tmp_path, batch_files=2,
                                  crash_after_send=True)
    files = [add_file(queue, tmp_path / "data", task, f"c{i}.bin", os.urandom(3000)) for i in range(2)]
    with pytest.raises(KeyboardInterrupt):
        first.run_once()
    assert work.batches == [2] and all(queue.get(f.id).submitted_at is None for f in files)
    # the next process finds both files on chain, one by one, and sends nothing
    second, work2, queue2 = uploader(orch, devnet, provider, node, tmp_path, batch_files=2)
    report = second.run_once()
    assert sorted(report.submitted) == sorted(f.sha256 for f in files)
    assert work2.batches == [] and work2.sent == 0
    for f in files:
        events = submissions(devnet, f.sha256)
        assert len(events) == 1 and queue2.get(f.id).tx_hash == events[0].tx_hash


def test_a_batch_holding_a_file_on_chain_settles_it_and_sends_the_rest(world, devnet, tmp_path) -> None:
    orch, provider, nodes, task = world
    node = nodes[2]
    up, work, queue = uploader(orch, devnet, provider, node, tmp_path, batch_files=4)
    files = [add_file(queue, tmp_path / "data", task, f"d{i}.bin", os.urandom(3000)) for i in range(4)]
    # the record lost (a new disk), file 1 already on chain by this node
    tx = devnet.client(provider).submit_work(devnet.pool_id, node.address, "0x" + files[1].sha256, 4).tx_hash
    report = up.run_once()
    assert report.submitted == [files[1].sha256] and queue.get(files[1].id).tx_hash == tx
    assert work.batches == []  # refused at estimation: nothing mined
    # the next pass: the three others, in one batch (no longer full: they go out once old enough)
    up.batch_age = 0.0
    report = up.run_once()
    assert report.submitted == [files[i].sha256 for i in (0, 2, 3)] and work.batches == [3]
    for f in files:
        assert len(submissions(devnet, f.sha256)) == 1
