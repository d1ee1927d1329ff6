"""Verdicts graded by evidence (issue 37, workloads/inference/judge/grades.py): a failed recomputation
slashes only on
evidence no honest noise makes; a marginal failure is not paid, looked at again, and slashes only when
the node repeats it; per-token edits spread one a row are caught by the file's outlier count."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from intellect.wire.verdicts import Submission
from intellect.workloads import MemoryNodeWindows, MemorySeenStore
from workloads.inference.judge.checks.model import FileStats, distribution_findings
from workloads.inference.judge.file_judge import InferenceJudge
from workloads.inference.judge.grades import Finding, grade, marked_files, unique_files
from workloads.inference.judge.thresholds import ValidationThresholds
from workloads.model.loading import ModelCheckpoints
from workloads.rollouts import read_rollouts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_statistics import LONG, NODE, edit_logprobs, files  # noqa: E402

TH = ValidationThresholds()


def row_finding(*rows: int) -> Finding:
    return Finding(rule="logprobs", reason="logprobs: …", rows=list(rows))


def test_the_grade_of_findings() -> None:
    assert grade([], TH) == "none"
    assert grade([row_finding(15)], TH) == "marginal"  # the honest row of the issue: one of 64
    assert grade([row_finding(1), Finding(rule="toploc", reason="t", rows=[1, 9])], TH) == "marginal"
    assert grade([row_finding(1), Finding(rule="toploc", reason="t", rows=[9, 30])], TH) == "strong"
    assert grade([Finding(rule="tokens after EOS", reason="t", rows=[2], exact=True)], TH) == "strong"
    assert grade([Finding(rule="toploc share", reason="s", excess=1.2)], TH) == "marginal"
    assert grade([Finding(rule="toploc share", reason="s", excess=1.25)], TH) == "strong"


def test_marks_and_pooled_sums_count_each_file_once() -> None:
    window = [{"file": "a", "marginal": True}, {"file": "b"}, {"file": "a", "marginal": True}, {"file": "c"}]
    assert marked_files(window) == 1
    assert [e["file"] for e in unique_files(window)] == ["b", "a", "c"]


def test_outliers_spread_one_a_row_are_counted_over_the_file() -> None:
    """Each row holds one outlier token (allowed a row), 64 rows: the file holds 64 where an honest
    file of 64 rows is expected to hold none (one row in ~6,000 has one); the limit is 2 + 0.002/row."""
    honest = FileStats(rows=64, lp_outliers=1, lp_tokens=1000)
    assert distribution_findings(honest, TH, "the file") == []
    assert TH.outlier_limit(64) == pytest.approx(2.128)
    [found] = distribution_findings(FileStats(rows=64, lp_outliers=64, lp_tokens=1000), TH, "the file")
    assert found.rule == "logprob outliers" and found.excess > TH.file_strong_factor
    assert grade([found], TH) == "strong"


@pytest.fixture(scope="module")
def long_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return files(tmp_path_factory.mktemp("long"), LONG, 5)


def dented(src: Path, dst: Path, rows: set[int] | None) -> Path:
    """-0.45 on two tokens of the long rows named (None: one token, sign alternating, on every row)."""
    long_rows = [i for i, r in enumerate(read_rollouts(src)[0]) if len(r.output_tokens) >= 28]
    assert long_rows, "the math set gives long rows"
    first = long_rows[0]

    def edit(i: int, r) -> list[float]:  # noqa: ANN001
        lps = list(r.output_logprobs)
        if rows is None:  # + where the logprob stays a logprob (<= 0), else -
            t = len(lps) // 2
            lps[t] += 0.45 if i % 2 and lps[t] <= -0.45 else -0.45
        elif i in (rows or {first}):
            for t in (3, 11):
                lps[t] -= 0.45
        return lps

    return edit_logprobs(src, dst, edit)


def test_a_marginal_file_is_not_paid_and_the_fourth_in_a_window_slashes(
    long_files: list[Path], tmp_path: Path
) -> None:
    """One row of a file with two -0.45 dents (each token under the cap, the row mean under its limit,
    two outliers where honest rows hold at most one; the file's two outliers within its count): before,
    `invalidate` at once. One row is no evidence beyond honest noise: not paid, marked; the node's
    fourth such file in its window slashes. An honest file between them passes every check but is
    held (issue 54: a marginal file's counter is forfeited, as a withheld batch's, so that a node
    cannot drop a batch by making it marginal)."""
    pipeline = InferenceJudge(LONG, MemorySeenStore(), ModelCheckpoints(LONG.model),
                              windows=MemoryNodeWindows())  # fmt: skip
    verdicts = []
    for k, src in enumerate(long_files):
        path = src if k == 1 else dented(src, tmp_path / f"dented-{k}.parquet", set())
        verdicts.append(pipeline.judge(path, Submission(node=NODE)))
    kinds = [v.verdict for v in verdicts]
    assert TH.marginal_files == 4
    assert kinds == ["soft_invalidate"] * 4 + ["invalidate"], [v.reasons for v in verdicts]
    honest = verdicts[1].reasons  # held, and nothing else
    assert len(honest) == 1, honest
    assert "is held: counter 1 was not judged on its merits (a marginal" in honest[0], honest
    assert "marginal: not paid, not slashed" in verdicts[0].reasons[0]
    assert "seen again at prefill batch 1" in verdicts[0].reasons[0]
    assert "repeated" in verdicts[4].reasons[0], verdicts[4].reasons


def test_a_failure_that_does_not_repeat_on_the_second_look_is_no_evidence(long_files: list[Path]) -> None:
    """What the second look drops: row findings its recomputation does not repeat; file statistics stay."""
    pipeline = InferenceJudge(LONG, MemorySeenStore(), ModelCheckpoints(LONG.model))
    rows, _ = read_rollouts(long_files[0])
    from workloads.inference.judge.checks.context import FileContext

    ctx = FileContext(
        path=long_files[0], submission=Submission(node=NODE), task=LONG, thresholds=TH, records=[],
        tokenizer=pipeline.tokenizer, seen=MemorySeenStore(), checkpoints=ModelCheckpoints(), vocab_size=0,
        rows=rows,
    )  # fmt: skip
    asked: list[tuple[int, int]] = []

    def clean(subset, batch):  # noqa: ANN001, ANN202 - the honest rows recomputed again pass
        asked.append((len(subset), batch))
        return [], FileStats()

    share = Finding(rule="toploc share", reason="s", excess=1.1)
    assert pipeline._second_look(ctx, [row_finding(2, 5), share], clean) == [share]
    assert asked == [(2, 1)]  # only the failing rows, at prefill batch 1

    def again(subset, batch):  # noqa: ANN001, ANN202 - the second of the two rows fails again
        return [row_finding(1)], FileStats()

    [kept] = pipeline._second_look(ctx, [row_finding(2, 5)], again)
    assert kept.rows == [5] and "seen again at prefill batch 1" in kept.reason


def test_one_dent_on_every_row_is_strong_evidence(long_files: list[Path], tmp_path: Path) -> None:
    """±0.45 on one token of every row, sign alternating: no row fails and the signed bias cancels;
    the file's outlier count (one a row) is far past what honest files hold."""
    pipeline = InferenceJudge(LONG, MemorySeenStore(), ModelCheckpoints(LONG.model))
    path = dented(long_files[0], tmp_path / "every-row.parquet", None)
    verdict = pipeline.judge(path, Submission(node=NODE))
    assert verdict.verdict == "invalidate", verdict.reasons
    assert any("off the recomputed ones by more than 0.15" in r for r in verdict.reasons), verdict.reasons
