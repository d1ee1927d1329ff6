"""One record per worker file (worker/files.py), and the data directory of a worker from before it.

`tests/fixtures/worker-state-v1/` was made by the worker's code as it was when a file lived in two
tables (the bridge's `files` queue and the uploader's `uploader.sqlite` journal; its README lists
how each row got its state). Started on it, the worker upgrades the queue in place and merges the
journal; its uploader then sends exactly the files that were never on chain, asks the chain about
the one a crash left "maybe sent", and sends nothing twice."""

from __future__ import annotations

import shutil
from pathlib import Path

from intellect.identity import Wallet
from worker.files import FileState, WorkerFiles
from worker.runtime import start_runtime
from worker.uploader import Uploader

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "worker-state-v1"
NODE = Wallet.from_key("0x" + "11" * 32)  # the node the fixture's files were made for
SENT_BEFORE_A_CRASH = "0x" + "c1" * 32  # c-sending-sent.bin's transaction, on chain, never recorded
ON_CHAIN = {  # every transaction the old worker recorded
    "e-submitted.bin": "0xc925488ed94114dedd0d6271373d60563014ab5cce31783b35f0b2c47b6c37fb",
    "i-submitted-after-retry.bin": "0xb77b8545fcbeb5e9577aba5aff3a5b7bb99b0a7a3989ee8e130011193ef8349a",
    "j-submitted-unmarked.bin": "0x3c194700ebf31828158c5086bab040a13c0bbd35ac7ba25a3d69843abad12b5f",
    "k-batch-0.bin": "0x" + "ba" * 32,
    "k-batch-1.bin": "0x" + "ba" * 32,
}


class Chain:
    """The ledger as the old worker left it: what it sent is on chain under this node; counts sends."""

    node, pool_id = NODE.address, 1

    def __init__(self, files: WorkerFiles) -> None:
        by_name = {f.relative_path: f.sha256 for f in files.all()}
        self.owner = {by_name[name]: NODE.address for name in [*ON_CHAIN, "c-sending-sent.bin"]}
        self.txs = {by_name["c-sending-sent.bin"]: SENT_BEFORE_A_CRASH}
        self.sent: list[str] = []

    def submit(self, work_key: str, units: int) -> str:
        assert work_key not in self.owner, "a file on chain was sent again"
        self.sent.append(work_key)
        self.owner[work_key] = NODE.address
        return "0x" + f"{len(self.sent):064x}"

    def submit_batch(self, files: list[tuple[str, int]]) -> str:
        raise AssertionError("not batched here")

    def owner_of(self, work_key: str) -> str | None:
        return self.owner.get(work_key)

    def submission_tx(self, work_key: str) -> str | None:
        return self.txs.get(work_key)


def old_worker(tmp_path: Path) -> Path:
    state = tmp_path / "worker"
    shutil.copytree(FIXTURE, state, ignore=shutil.ignore_patterns("*.md"))
    return state


def test_an_old_data_directory_migrates_on_start_and_nothing_is_lost_or_sent_twice(tmp_path: Path) -> None:
    state = old_worker(tmp_path)
    runtime = start_runtime("process", NODE.address, state, adopt=False)  # what `intellect-worker start` does
    try:
        assert runtime.bridge is not None
        files = runtime.bridge.files
    finally:
        runtime.close()
    assert not (state / "uploader.sqlite").exists() and (state / "uploader.sqlite.merged").is_file()
    record = {f.relative_path: f for f in files.all()}
    assert [f.id for f in files.all()] == list(range(1, 13))  # same ids, same order: nothing lost
    assert {name: f.state for name, f in record.items()} == {
        "a-announced.bin": FileState.ANNOUNCED,
        "b-uploaded.bin": FileState.UPLOADED,
        "c-sending-sent.bin": FileState.SENDING,
        "d-sending-unsent.bin": FileState.SENDING,
        "e-submitted.bin": FileState.SUBMITTED,
        "f-refused-upload.bin": FileState.REFUSED,
        "g-zero-units.bin": FileState.REFUSED,
        "h-foreign.bin": FileState.REFUSED,
        "i-submitted-after-retry.bin": FileState.SUBMITTED,
        "j-submitted-unmarked.bin": FileState.SUBMITTED,
        "k-batch-0.bin": FileState.SUBMITTED,
        "k-batch-1.bin": FileState.SUBMITTED,
    }
    assert {name: record[name].tx_hash for name in ON_CHAIN} == ON_CHAIN
    assert record["f-refused-upload.bin"].uploaded_at is None
    assert "upload_max_bytes" in (record["f-refused-upload.bin"].reason or "")
    assert "zero work units" in (record["g-zero-units.bin"].reason or "")
    assert "0x0b0b" in (record["h-foreign.bin"].reason or "")
    assert all(record[n].tx_hash is None and record[n].submitted_at is None for n in ("g-zero-units.bin",
                                                                                       "h-foreign.bin"))
    assert {n: f.attempts for n, f in record.items() if f.attempts} == {
        "c-sending-sent.bin": 1, "d-sending-unsent.bin": 1, "e-submitted.bin": 1, "h-foreign.bin": 1,
        "i-submitted-after-retry.bin": 2, "j-submitted-unmarked.bin": 1, "k-batch-0.bin": 1,
        "k-batch-1.bin": 1,
    }  # fmt: skip
    assert [f.relative_path for f in files.pending_upload()] == ["a-announced.bin"]

    chain = Chain(files)
    uploader = Uploader(NODE, files, chain, lambda: None)  # no orchestrator: submissions only
    report = uploader.run_once()
    sent = {f.sha256: f.relative_path for f in files.all()}
    assert sorted(sent[k] for k in chain.sent) == ["b-uploaded.bin", "d-sending-unsent.bin"]
    assert sorted(sent[k] for k in report.submitted) == ["b-uploaded.bin", "c-sending-sent.bin",
                                                         "d-sending-unsent.bin"]  # fmt: skip
    after = {f.relative_path: f for f in files.all()}
    assert after["c-sending-sent.bin"].tx_hash == SENT_BEFORE_A_CRASH  # asked, not sent
    assert after["d-sending-unsent.bin"].attempts == 2
    assert {name: after[name].tx_hash for name in ON_CHAIN} == ON_CHAIN
    assert uploader.run_once().submitted == [] and len(chain.sent) == 2


def test_a_merge_cut_short_and_run_again_changes_nothing(tmp_path: Path) -> None:
    """A crash after the merge committed and before the journal was renamed: the next start merges it
    again, and since a merge only moves a file forward, the record is the same."""
    state = old_worker(tmp_path)
    files = WorkerFiles(state / "bridge" / "files.sqlite")
    assert files.merge_journal(state / "uploader.sqlite") == 6  # c, d, f, g, h, j moved
    once = files.all()
    (state / "uploader.sqlite.merged").rename(state / "uploader.sqlite")
    again = WorkerFiles(state / "bridge" / "files.sqlite")
    assert again.merge_journal(state / "uploader.sqlite") == 0
    assert again.all() == once
    assert again.merge_journal(state / "uploader.sqlite") == 0  # renamed: nothing left to merge


def test_one_record_carries_a_file_from_announced_to_submitted_or_refused(tmp_path: Path) -> None:
    files = WorkerFiles(tmp_path / "files.sqlite")
    made, created = files.add("t", tmp_path / "a.bin", "a.bin", "ab" * 32, 3, 10)
    assert created and made.state == FileState.ANNOUNCED and made.attempts == 0
    assert files.add("t", tmp_path / "again.bin", "again.bin", "ab" * 32, 3, 10) == (made, False)
    assert files.mark_uploaded(made.id, "t/a.bin").state == FileState.UPLOADED
    assert files.mark_sending(made.id).attempts == 1 and files.pending_submission()[0].id == made.id
    done = files.mark_submitted(made.id, "0x" + "01" * 32)
    assert (done.state, done.tx_hash) == (FileState.SUBMITTED, "0x" + "01" * 32)
    assert files.mark_submitted(made.id, "").tx_hash == "0x" + "01" * 32  # a known tx is never lost
    other, _ = files.add("t", tmp_path / "b.bin", "b.bin", "cd" * 32, 0, 10)
    refused = files.mark_refused(other.id, "zero work units")
    assert (refused.state, refused.reason) == (FileState.REFUSED, "zero work units")
    assert files.pending_upload() == files.pending_submission() == []
    assert WorkerFiles(tmp_path / "files.sqlite").all() == files.all()  # reopened: as it was
