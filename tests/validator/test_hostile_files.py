"""Hostile rollout files: a few KB that declare gigabytes once decompressed are refused from their
footer, before any data is read, with an `invalidate` verdict that names the limit; the CLI judges
them at flat memory; and a file the checks choke on cannot hold up the files queued behind it."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from validator.fetch import Fetcher
from validator.judging import JudgeLoop
from validator.store import Database, SubmissionRow, Submissions, Verdicts, open_database
from validator.verdicts import Submission, Verdict
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
    program = ("from pathlib import Path; from tests.validator.test_hostile_files import bomb; "
               f"bomb(Path({str(path)!r}), per_row=30_000_000, repeats=5, rows=4)")  # fmt: skip
    subprocess.run([sys.executable, "-c", program], check=True, timeout=300, cwd=Path(__file__).parents[2])
    assert path.stat().st_size < 5_000_000
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result = subprocess.run([str(BIN / "intellect-validator"), "check", str(path), "--json"],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert result.returncode == 1, result.stderr[-2000:]
    verdict = json.loads(result.stdout.strip().splitlines()[-1])
    assert verdict["verdict"] == "invalidate"
    assert "column 'input_tokens' declares" in " ".join(verdict["reasons"]), verdict
    assert max(peak_kb, before) < 1_500_000, f"peak RSS {peak_kb} KB"  # the model and torch, no data


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
    keys = ["0x" + f"{i:064x}" for i in (1, 2, 3)]  # the first is the poison, judged first
    fetcher = Fetcher("http://127.0.0.1:9", _wallet(), tmp_path / "files", max_bytes=1 << 20, timeout=1)
    for key in keys:
        fetcher.path_for(key[2:]).write_bytes(b"already downloaded")
    with db.transaction() as s:
        for i, key in enumerate(keys):
            s.add(SubmissionRow(pool_id=1, work_key=key, node="0x" + "22" * 20,
                                provider="0x" + "33" * 20, units=1, block_number=10 + i,
                                tx_hash="0x" + "44" * 32, submitted_at=0))  # fmt: skip
    judge = ChokingJudge(poison=keys[0][2:])
    loop = JudgeLoop(submissions, verdicts, fetcher, judge, fetch_window=600, vote=False, base_delay=0.0,
                     poison_limit=3)  # fmt: skip
    loop.run_once()
    got = {v.work_key: v for v in verdicts.page(pool_id=1, node=None, after=0, limit=10)}
    assert got[keys[1]].verdict == got[keys[2]].verdict == "accept"  # judged despite the poison first
    assert keys[0] not in got  # retried, not condemned on the first failure
    for _ in range(5):
        with db.transaction() as s:  # make it due again now (the backoff is what is under test elsewhere)
            s.get(SubmissionRow, (1, keys[0])).next_attempt_at = 0.0  # type: ignore[union-attr]
        loop.run_once()
    got = {v.work_key: v for v in verdicts.page(pool_id=1, node=None, after=0, limit=10)}
    assert got[keys[0]].verdict == "soft_invalidate"  # never a slash: it may be our own bug
    assert "could not judge this file in 3 attempts" in got[keys[0]].reasons
    assert judge.calls.count(keys[0][2:] + ".parquet") == 3


def _wallet():  # noqa: ANN202
    from intellect.identity import Wallet

    return Wallet.create()
