"""Hostile rollout files: a few KB that declare gigabytes once decompressed are refused from their
footer, before any data is read, with an `invalidate` verdict that names the limit; the CLI judges
them at flat memory; and a file the checks choke on cannot hold up the files queued behind it."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from intellect.wire.verdicts import Submission, Verdict
from validator.fetch import Fetcher
from validator.judging import JudgeLoop
from validator.store import Database, SubmissionRow, Submissions, Verdicts, open_database
from workloads.inference.judge.reader import CappedReader, ReaderFailed
from workloads.rollouts import (
    COLUMNS,
    ROLLOUT_SCHEMA,
    BatchInfo,
    FileLimits,
    Rollout,
    RolloutSchemaError,
    RolloutTooLarge,
    check_footer,
    read_rollouts,
    to_table,
    write_rollouts,
)

INFO = BatchInfo(node_address="0x" + "11" * 20, step=0, batch_counter=1, group_size=4, max_new_tokens=32)
LIMITS = FileLimits.for_task(batch_size=8, n=4, max_prompt_tokens=4096, max_new_tokens=32)
BIN = Path(sys.executable).parent


def honest_rows(count: int = 32) -> list[Rollout]:
    return [Rollout(input_tokens=[5, 6, 7], output_tokens=[8, 9], output_logprobs=[-0.5, -0.25],
                    advantages=0.0, rewards=0.5, task_rewards=0.5, length_penalties=0.0,
                    proofs=b"\x00" * 258, step=0, target_lengths=8, task_type="reverse", seed=i,
                    temperature=1.0, problem_id=str(i))
            for i in range(count)]  # fmt: skip


def bomb(path: Path, *, column: str = "input_tokens", per_row: int = 2_000_000, repeats: int = 1,
         rows: int = 4) -> Path:  # fmt: skip
    """A parquet of the exact rollout schema whose `column` holds `per_row` zeros (or zero bytes) per
    row, written `repeats` times as row groups: tiny on disk, huge decompressed."""
    values: dict[str, list] = {name: [getattr(r, name) for r in honest_rows(rows)] for name in COLUMNS}
    if column == "proofs":
        values[column] = [b"\x00" * per_row] * rows
    elif column in ("task_type", "problem_id"):
        values[column] = ["a" * per_row] * rows
    elif column in ("input_tokens", "output_tokens", "output_logprobs"):
        kind = pa.float32() if column == "output_logprobs" else pa.int32()
        zeros = pa.array(np.zeros(per_row * rows, dtype=kind.to_pandas_dtype()))
        offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * per_row)
        values[column] = pa.ListArray.from_arrays(offsets, zeros)
    table = pa.Table.from_pydict(values, schema=ROLLOUT_SCHEMA).replace_schema_metadata(
        to_table(honest_rows(1), INFO).schema.metadata)  # fmt: skip
    with pq.ParquetWriter(path, table.schema, compression="zstd") as writer:
        for _ in range(repeats):
            writer.write_table(table)
    return path


def test_an_honest_file_reads_within_its_tasks_limits(tmp_path: Path) -> None:
    path = tmp_path / "honest.parquet"
    write_rollouts(path, honest_rows(), INFO)
    rows, info = read_rollouts(path, LIMITS)
    assert len(rows) == 32 and info == INFO


@pytest.mark.parametrize(
    ("column", "per_row", "repeats", "rows", "says"),
    [
        ("input_tokens", 2_000_000, 1, 4, "column 'input_tokens' declares"),  # long lists of zeros
        ("output_logprobs", 500_000, 1, 4, "column 'output_logprobs' declares"),
        ("proofs", 4_000_000, 1, 4, "column 'proofs' declares"),  # one huge binary value
        ("problem_id", 1_000_000, 1, 4, "column 'problem_id' declares"),  # a huge string
        ("seed", 1, 100, 4, "row groups"),  # many row groups
        ("seed", 1, 1, 40, "40 rows declared"),  # more rows than the task's batch
    ],
)
def test_bombs_are_refused_from_the_footer(
    tmp_path: Path, column: str, per_row: int, repeats: int, rows: int, says: str
) -> None:
    path = bomb(tmp_path / "bomb.parquet", column=column, per_row=per_row, repeats=repeats, rows=rows)
    assert path.stat().st_size < 2_000_000  # small on disk
    with pytest.raises(RolloutTooLarge, match=says):
        check_footer(path, LIMITS)


def test_a_footer_that_lies_about_its_length_or_a_truncated_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "honest.parquet"
    write_rollouts(path, honest_rows(), INFO)
    data = path.read_bytes()
    lying = tmp_path / "lying.parquet"
    lying.write_bytes(data[:-8] + (10**9).to_bytes(4, "little") + b"PAR1")
    with pytest.raises(RolloutTooLarge, match="footer of"):
        check_footer(lying, LIMITS)
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(RolloutSchemaError):
        read_rollouts(truncated, LIMITS)


def test_a_malformed_row_is_named_in_a_sentence(tmp_path: Path) -> None:
    rows = honest_rows(4)
    table = to_table(rows, INFO)
    logprobs = table.column("output_logprobs").to_pylist()
    logprobs[3] = logprobs[3][:-1]
    table = table.set_column(COLUMNS.index("output_logprobs"), ROLLOUT_SCHEMA.field("output_logprobs"),
                             pa.array(logprobs, type=pa.list_(pa.float32())))  # fmt: skip
    path = tmp_path / "short.parquet"
    pq.write_table(table, path)
    with pytest.raises(RolloutSchemaError, match=r"row 3: output_logprobs has 1 values for 2 output tokens"):
        read_rollouts(path)


@pytest.mark.slow
def test_the_cli_judges_a_gigabyte_bomb_at_flat_memory(tmp_path: Path) -> None:
    """The issue's case: a small file declaring 2.4 GB of tokens. Before the footer check, reading it
    died with ArrowMemoryError at 2.3-3.7 GB of RSS and gave no verdict."""
    path = tmp_path / "bomb.parquet"
    # Built in another process: a child forked from a big pytest process would inherit its peak RSS.
    program = ("from pathlib import Path; from tests.workloads.judge.test_hostile_files import bomb; "
               f"bomb(Path({str(path)!r}), per_row=30_000_000, repeats=5, rows=4)")  # fmt: skip
    subprocess.run([sys.executable, "-c", program], check=True, timeout=300, cwd=Path(__file__).parents[3])
    assert path.stat().st_size < 5_000_000
    # The peak is read by a fresh parent whose only child is the validator: this process's own
    # RUSAGE_CHILDREN keeps the largest child it ever waited for (an earlier test's trainer, say).
    watcher = ("import resource, subprocess, sys; "
               "done = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, text=True); "
               "sys.stdout.write(done.stdout); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
               "sys.exit(done.returncode)")  # fmt: skip
    command = [str(BIN / "intellect-validator"), "check", str(path), "--json"]
    result = subprocess.run([sys.executable, "-c", watcher, *command], capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    *printed, peak = result.stdout.strip().splitlines()
    peak_kb = int(peak)
    verdict = json.loads(printed[-1])
    assert verdict["verdict"] == "invalidate"
    assert "column 'input_tokens' declares" in " ".join(verdict["reasons"]), verdict
    assert peak_kb < 1_500_000, f"peak RSS {peak_kb} KB"  # the model and torch, no data


class ChokingJudge:
    """Our own checks failing on one file (a bug, or a file of a kind nobody foresaw)."""

    def __init__(self, poison: str) -> None:
        self.poison = poison
        self.calls: list[str] = []

    def judge(self, path: Path, submission: Submission) -> Verdict:
        self.calls.append(path.name)
        if self.poison in path.name:
            raise RuntimeError("the checks crashed on this file")
        return Verdict(file=str(path), verdict="accept")


def test_a_file_the_checks_choke_on_does_not_block_the_queue(tmp_path: Path) -> None:
    db = Database(open_database(None, tmp_path))
    submissions, verdicts = Submissions(db), Verdicts(db)
    keys = ["0x" + f"{i:064x}" for i in (1, 2, 3, 4)]  # the first is the poison, judged first
    # Other nodes' files are not held by it; the poisoner's own next file waits (chain order per node).
    nodes = ["0x" + "22" * 20, "0x" + "55" * 20, "0x" + "66" * 20, "0x" + "22" * 20]
    fetcher = Fetcher("http://127.0.0.1:9", _wallet(), tmp_path / "files", max_bytes=1 << 20, timeout=1)
    for key in keys:
        fetcher.path_for(key[2:]).write_bytes(b"already downloaded")
    with db.transaction() as s:
        for i, key in enumerate(keys):
            s.add(SubmissionRow(pool_id=1, work_key=key, node=nodes[i],
                                provider="0x" + "33" * 20, units=1, block_number=10 + i,
                                tx_hash="0x" + "44" * 32, submitted_at=0))  # fmt: skip
    judge = ChokingJudge(poison=keys[0][2:])
    loop = JudgeLoop(submissions, verdicts, fetcher, judge, fetch_window=600, vote=False, base_delay=0.0,
                     poison_limit=3)  # fmt: skip
    loop.run_once()
    got = {v.work_key: v for v in verdicts.page(pool_id=1, node=None, after=0, limit=10)}
    assert got[keys[1]].verdict == got[keys[2]].verdict == "accept"  # judged despite the poison first
    assert keys[0] not in got and keys[3] not in got  # retried, not condemned on the first failure
    for _ in range(5):
        with db.transaction() as s:  # make it due again now (the backoff is what is under test elsewhere)
            s.get(SubmissionRow, (1, keys[0])).next_attempt_at = 0.0  # type: ignore[union-attr]
        loop.run_once()
    got = {v.work_key: v for v in verdicts.page(pool_id=1, node=None, after=0, limit=10)}
    assert got[keys[0]].verdict == "soft_invalidate"  # never a slash: it may be our own bug
    assert got[keys[3]].verdict == "accept" and got[keys[3]].id > got[keys[0]].id
    assert "could not judge this file in 3 attempts" in got[keys[0]].reasons
    assert judge.calls.count(keys[0][2:] + ".parquet") == 3


def _wallet():  # noqa: ANN202
    from intellect.identity import Wallet

    return Wallet.create()


def understate_values(path: Path, column: int = 0, claimed: int = 1000) -> Path:
    """Patch the footer so that column chunk `column` declares `claimed` values instead of its real
    count: thrift's compact varints can be padded, so the footer keeps its length (a footer that lies)."""

    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            byte, n = n & 0x7F, n >> 7
            out.append(byte | (0x80 if n else 0))
            if not n:
                return bytes(out)

    real = pq.ParquetFile(path).metadata.row_group(0).column(column).num_values
    data = path.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    head, footer = data[: -8 - length], data[-8 - length : -8]
    honest = varint(real << 1)  # zigzag of a positive i64
    forged = bytearray(varint(claimed << 1))
    while len(forged) < len(honest):  # pad with continuation bytes to the same length
        forged[-1] |= 0x80
        forged.append(0)
    assert footer.count(honest) >= 1
    lying = path.with_name("lying-" + path.name)
    lying.write_bytes(head + footer.replace(honest, bytes(forged)) + data[-8:])
    return lying


def test_a_footer_that_understates_its_values_passes_the_footer_check_but_not_the_reader(
    tmp_path: Path,
) -> None:
    """The footer check only sees what the footer says; a footer patched to declare 1,000 tokens for
    a column holding 120 million passes it. The capped reader then refuses the file (pyarrow reads only
    what is declared and finds the columns disagree), in the child, at flat memory for the validator."""
    program = ("from pathlib import Path; from tests.workloads.judge.test_hostile_files import bomb; "
               f"bomb(Path({str(tmp_path / 'bomb.parquet')!r}), per_row=30_000_000, rows=4)")  # fmt: skip
    subprocess.run([sys.executable, "-c", program], check=True, timeout=300, cwd=Path(__file__).parents[3])
    lying = understate_values(tmp_path / "bomb.parquet")
    with pytest.raises(RolloutTooLarge):
        check_footer(tmp_path / "bomb.parquet", LIMITS)
    check_footer(lying, LIMITS)  # the lie gets past the footer check...
    reader = CappedReader()
    rss_before = _rss_kb()
    try:
        with pytest.raises(RolloutSchemaError, match="cannot be read|expected length"):
            reader.read(lying, LIMITS)  # ...and not past the reader
        rows, _ = reader.read(_honest_file(tmp_path), LIMITS)  # the same child reads on
        assert len(rows) == 32
    finally:
        reader.close()
    assert _rss_kb() - rss_before < 50_000


def test_a_file_that_needs_more_memory_than_the_cap_is_invalidated_and_the_validator_stays_flat(
    tmp_path: Path,
) -> None:
    """Whatever gets past the footer check and still needs memory (a page header's size, pyarrow's own
    allocations) hits the reader child's cap: a memory error there, a verdict reason here. The bomb
    stands in for such a file: its limits are set to let it through the footer check."""
    program = ("from pathlib import Path; from tests.workloads.judge.test_hostile_files import bomb; "
               f"bomb(Path({str(tmp_path / 'bomb.parquet')!r}), per_row=30_000_000, rows=4)")  # fmt: skip
    subprocess.run([sys.executable, "-c", program], check=True, timeout=300, cwd=Path(__file__).parents[3])
    let_through = FileLimits(max_rows=32, max_tokens_per_row=40_000_000, max_new_tokens=32)
    check_footer(tmp_path / "bomb.parquet", let_through)
    reader = CappedReader(memory_bytes=256 << 20, per_declared_byte=0)
    rss_before = _rss_kb()
    try:
        with pytest.raises(RolloutTooLarge, match="needs more than the reader's 256 MB of memory"):
            reader.read(tmp_path / "bomb.parquet", let_through)
        rows, _ = reader.read(_honest_file(tmp_path), LIMITS)  # and honest files are read after it
        assert len(rows) == 32
    finally:
        reader.close()
    assert _rss_kb() - rss_before < 50_000  # the 480 MB of tokens were never in this process


def test_a_reader_that_dies_or_hangs_is_not_the_files_fault(tmp_path: Path) -> None:
    """A dead or slow reader says nothing about the file: ReaderFailed (the judge loop retries, and
    after its attempts soft-invalidates, never slashes), and the next read starts a new child."""
    honest = _honest_file(tmp_path)
    reader = CappedReader()
    try:
        reader.read(honest, LIMITS)
        assert reader._process is not None
        reader._process.kill()
        reader._process.wait()
        rows, _ = reader.read(honest, LIMITS)  # a child found dead before a read is replaced
        assert len(rows) == 32
        # A hang: the child stopped (SIGSTOP) cannot answer within any timeout (a 1 ms timeout alone
        # was a race a warm child on an idle core sometimes won).
        assert reader._process is not None
        os.kill(reader._process.pid, signal.SIGSTOP)
        reader.timeout = 0.5
        with pytest.raises(ReaderFailed, match="took over"):
            reader.read(honest, LIMITS)
        reader.timeout = 60
        assert len(reader.read(honest, LIMITS)[0]) == 32
    finally:
        reader.close()


def _honest_file(tmp_path: Path) -> Path:
    path = tmp_path / "honest.parquet"
    write_rollouts(path, honest_rows(), INFO)
    return path


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_relative_path_is_the_validators_and_a_missing_file_is_never_the_nodes_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the README's RL loop in CI: the validator's data folder was relative (`rl-run/validator`)
    and the reader child, running in another folder, found no file there; the miss was reported as
    an unreadable file, and honest nodes were invalidated and slashed. Paths are now resolved by the
    validator, and an OSError in the reader is `ReaderFailed` (retried, never slashed)."""
    honest = _honest_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    reader = CappedReader()
    try:
        rows, _ = reader.read(Path(honest.name), LIMITS)  # relative to the validator's folder
        assert len(rows) == 32
        with pytest.raises(ReaderFailed, match="FileNotFoundError"):
            reader.read(tmp_path / "gone.parquet", LIMITS)
    finally:
        reader.close()


def _vm_size(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize")


def test_a_hard_memory_limit_of_the_validators_own_is_never_the_files_fault(tmp_path: Path) -> None:
    """Issue 37: a validator started under a finite hard RLIMIT_AS (`ulimit -v`, `prlimit --as`,
    `docker --ulimit`, a batch scheduler) had its reader ask for more than that hard limit, the kernel
    refused, and every honest file was called unreadable: invalidated, slashed. The reader now reads
    under the lower ceiling, and a memory error below its own cap is `ReaderFailed` (retried, never
    slashed). The limit is put on the running reader child, as its parent's would be inherited."""
    honest = _honest_file(tmp_path)
    reader = CappedReader()  # 1 GiB over its baseline for a read
    try:
        reader.read(honest, LIMITS)
        assert reader._process is not None
        pid = reader._process.pid
        # Hard limit 256 MB over what the child holds now: below the 1 GiB it would set itself.
        hard = _vm_size(pid) + (256 << 20)
        resource.prlimit(pid, resource.RLIMIT_AS, (hard, hard))
        rows, _ = reader.read(honest, LIMITS)  # an honest file still reads
        assert len(rows) == 32
        # A file that needs more than that hard limit and less than the reader's own cap: out of
        # memory under the validator's limit, not the reader's, so nothing is known about the file.
        big = bomb(tmp_path / "big.parquet", per_row=2_000_000, rows=4)  # 8 M tokens: ~300 MB read
        let_through = FileLimits(max_rows=32, max_tokens_per_row=4_000_000, max_new_tokens=32)
        tight = _vm_size(pid) + (64 << 20)
        resource.prlimit(pid, resource.RLIMIT_AS, (tight, tight))
        with pytest.raises(ReaderFailed, match="own hard address-space limit|died") as failed:
            reader.read(big, let_through)
        assert not isinstance(failed.value, RolloutSchemaError)
        assert len(reader.read(honest, LIMITS)[0]) == 32  # a new child, without the limit, reads it
    finally:
        reader.close()


def test_what_a_file_decodes_to_is_bounded_by_its_task_before_rows_are_made() -> None:
    """Issue 37.7: the footer check sees only what the footer declares, and a page header can
    understate its pages; such a file reached 1.47 GB in the validator process, because the reader
    child handed over whatever it decoded within its own (larger) cap. The decoded table is now held
    to the task's shape in the child, before any row becomes a Python object."""
    from workloads.rollouts import check_decoded, to_table

    check_decoded(to_table(honest_rows(), INFO), LIMITS)  # an honest batch of the task's shape
    with pytest.raises(RolloutTooLarge, match="33 rows where its task allows 32"):
        check_decoded(to_table(honest_rows(33), INFO), LIMITS)
    long_row = [r.model_copy(update={"input_tokens": [5] * 4200}) if i == 7 else r
                for i, r in enumerate(honest_rows())]  # fmt: skip
    with pytest.raises(RolloutTooLarge, match="'input_tokens' has a row of 4200 values where its task"):
        check_decoded(to_table(long_row, INFO), LIMITS)
    # bytes that no count of values shows: a text column far past its task's bytes
    wordy = [r.model_copy(update={"problem_id": "x" * 100_000}) for r in honest_rows()]
    with pytest.raises(RolloutTooLarge, match="'problem_id' decodes to 3200128 bytes where its task allows"):
        check_decoded(to_table(wordy, INFO), LIMITS)


def test_corrupt_compression_in_the_nodes_own_bytes_is_its_fault(tmp_path: Path) -> None:
    """Issue 37.7: a file whose pages do not decompress was retried and soft-invalidated at most
    (pyarrow says so with an OSError, which the reader took for the system's). The validator hashes
    the bytes against the node's signed work key before it reads them, so bytes that do not decode are
    the node's: `RolloutSchemaError` (invalidate), after a second read agrees. A system error (an
    errno: a missing file) stays `ReaderFailed`."""
    honest = _honest_file(tmp_path)
    data = bytearray(honest.read_bytes())
    meta = pq.ParquetFile(honest).metadata
    column = meta.row_group(0).column(COLUMNS.index("output_logprobs"))
    assert column.compression == "SNAPPY"
    start = column.data_page_offset
    header_end = start + 40  # past the page header: into the snappy-compressed values
    corrupt = tmp_path / "corrupt.parquet"
    for k in range(header_end, header_end + 8):
        data[k] ^= 0x5A
    corrupt.write_bytes(bytes(data))
    reader = CappedReader()
    try:
        with pytest.raises(RolloutSchemaError, match="do not decode") as caught:
            reader.read(corrupt, LIMITS)
        assert not isinstance(caught.value, RolloutTooLarge)
        with pytest.raises(ReaderFailed, match="FileNotFoundError"):
            reader.read(tmp_path / "gone.parquet", LIMITS)
        assert len(reader.read(honest, LIMITS)[0]) == 32
    finally:
        reader.close()
