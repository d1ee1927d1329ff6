"""Statistics that no single small file or short row can carry (issue 18.3, 18.4): a row's limit on
its mean logprob error grows as it gets shorter (one honest outlier token in a 4-token row slashed an
honest node), several outlier tokens or a consistent bias are caught however small each edit is, and
each node's recent files are pooled so that a cheater cannot stay under a per-file minimum of
chunks. Honest files come from the real inference workload; cheats are what a worker would write."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from intellect.wire.verdicts import Submission, Verdict
from intellect.workloads import MemoryNodeWindows, MemorySeenStore
from workloads.inference.judge.file_judge import InferenceJudge
from workloads.inference.judge.thresholds import ValidationThresholds
from workloads.inference.settings import InferenceSettings
from workloads.inference.task import TaskSettings
from workloads.inference.workload import InferenceWorkload
from workloads.model.loading import ModelCheckpoints
from workloads.rollouts import read_rollouts, write_rollouts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_attacks import follow_on  # noqa: E402

NODE = "0x5aeda56215b167893e80b4fe645ba6d5bab767de"
SMALL = TaskSettings(batch_size=1, n=4, max_new_tokens=16, target_lengths=[8])  # one prompt per file
# the tiny model writes long answers (up to 48 tokens) only for the math set
LONG = TaskSettings(dataset="math", batch_size=4, n=4, max_new_tokens=48, target_lengths=[48],
                    length_penalty=0.0)


def files(out: Path, task: TaskSettings, count: int, **kw: object) -> list[Path]:
    workload = InferenceWorkload(InferenceSettings(
        node_address=NODE, output_dir=out, batch_size=task.batch_size, n=task.n,
        max_new_tokens=task.max_new_tokens, target_lengths=task.target_lengths,
        length_penalty=task.length_penalty, dataset=task.dataset, **kw,
    ))  # fmt: skip
    return [Path(workload.run_batch().path) for _ in range(count)]  # type: ignore[union-attr]


def judge_all(paths: list[Path], task: TaskSettings) -> list[Verdict]:
    """One validator judging a node's files in order (its window of that node's statistics grows)."""
    pipeline = InferenceJudge(task, MemorySeenStore(), ModelCheckpoints(task.model),
                              windows=MemoryNodeWindows())  # fmt: skip
    return [pipeline.judge(p, Submission(node=NODE)) for p in paths]


def edit_logprobs(src: Path, dst: Path, edit) -> Path:  # noqa: ANN001
    rows, info = read_rollouts(src)
    edited = [r.model_copy(update={"output_logprobs": edit(i, r)}) for i, r in enumerate(rows)]
    write_rollouts(dst, edited, info)
    return dst


@pytest.fixture(scope="module")
def honest_small(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return files(tmp_path_factory.mktemp("small"), SMALL, 24)


def test_the_row_limit_grows_as_rows_get_shorter() -> None:
    th = ValidationThresholds()
    assert th.row_mean_limit(1) > th.row_mean_limit(4) > th.row_mean_limit(64) > th.logprob_mean_tolerance
    # the honest row that was slashed: 4 tokens, mean error 0.053, worst token 0.21
    assert th.row_mean_limit(4) > (0.21 + 3 * 0.0) / 4
    assert th.bias_limit(10) > th.bias_limit(1000) > th.logprob_bias_floor


def test_one_honest_outlier_token_in_a_short_row_is_not_slashed(
    honest_small: list[Path], tmp_path: Path
) -> None:
    """The demo's honest slash, reproduced: one token of a short row off by 0.21 (a bf16 near-tie on a
    trained checkpoint), the others exact. The old row-mean limit (0.05) invalidated it."""
    def bump(i: int, r) -> list[float]:  # noqa: ANN001
        lps = list(r.output_logprobs)
        if i == 0 and len(lps) <= 8:
            lps[0] = min(0.0, lps[0] - 0.21) if lps[0] > -0.21 else lps[0] + 0.21
        return lps

    src = next(p for p in honest_small if len(read_rollouts(p)[0][0].output_tokens) <= 8)
    pipeline = InferenceJudge(SMALL, MemorySeenStore(), ModelCheckpoints(SMALL.model))
    follow_on(pipeline, src, NODE)
    verdict = pipeline.judge(edit_logprobs(src, tmp_path / "outlier.parquet", bump), Submission(node=NODE))
    assert verdict.verdict == "accept", verdict.reasons


def test_honest_small_files_pooled_over_a_node_are_all_accepted(honest_small: list[Path]) -> None:
    verdicts = judge_all(honest_small, SMALL)
    assert [v.verdict for v in verdicts] == ["accept"] * len(honest_small), [v.reasons for v in verdicts]


def test_a_consistent_small_bias_is_caught(tmp_path: Path) -> None:
    """+0.045 nats on every logprob (kept at or below 0): each token and each row mean stays under
    its limit; the signed mean over the file does not."""
    src = files(tmp_path / "bias-src", LONG, 1)[0]
    biased = edit_logprobs(src, tmp_path / "biased.parquet",
                           lambda i, r: [min(0.0, x + 0.045) for x in r.output_logprobs])  # fmt: skip
    [verdict] = judge_all([biased], LONG)
    assert verdict.verdict == "invalidate"
    assert any("consistent bias" in reason for reason in verdict.reasons), verdict.reasons


def test_several_outlier_edits_in_a_long_row_are_caught(tmp_path: Path) -> None:
    """-0.45 on three tokens of a long row: every token under the 0.5 cap, the row's mean under its
    limit, but three outliers where an honest row has at most one. One row failing is marginal
    evidence (tests/workloads/judge/test_grades.py), but three outliers in one file are also past the file's
    outlier count (2 + 0.002 a row; honest files hold about one in 6,000 rows): strong, slashed."""
    src = files(tmp_path / "long-src", LONG, 3)
    rows_of = {p: read_rollouts(p)[0] for p in src}
    path, row = next((p, i) for p, rows in rows_of.items() for i, r in enumerate(rows)
                     if len(r.output_tokens) >= 28)  # fmt: skip

    def dent(i: int, r) -> list[float]:  # noqa: ANN001
        lps = list(r.output_logprobs)
        if i == row:
            for t in (3, 11, 19):
                lps[t] -= 0.45
        return lps

    pipeline = InferenceJudge(LONG, MemorySeenStore(), ModelCheckpoints(LONG.model))
    follow_on(pipeline, path, NODE)
    verdict = pipeline.judge(edit_logprobs(path, tmp_path / "dented.parquet", dent), Submission(node=NODE))
    assert verdict.verdict == "invalidate"
    assert any(reason.startswith("logprobs:") for reason in verdict.reasons), verdict.reasons


def test_a_node_making_small_fp32_files_is_caught_by_its_pooled_statistics(tmp_path: Path) -> None:
    """One prompt per file: too few TOPLOC chunks for the per-file statistics, so fp32 inference
    passed file by file (accepted in 2 of 3 tries). Pooled over the node's files it is caught."""
    cheats = files(tmp_path / "fp32", SMALL, 16, dtype="float32")
    verdicts = judge_all(cheats, SMALL)
    caught = [i for i, v in enumerate(verdicts) if v.verdict == "invalidate"]
    assert caught, [v.reasons for v in verdicts]
    assert any("(pooled)" in reason for reason in verdicts[caught[0]].reasons), verdicts[caught[0]].reasons
    assert caught[0] < 12  # within a dozen small files


def test_batch_counters_must_follow_each_other(tmp_path: Path) -> None:
    """Grinding (issue 18.5): a node makes batches 1..4 and submits only batch 3, its best. Counters
    must come in order, so batch 3 without 1 and 2 is not paid (soft: an honest worker can leave a
    gap), nor is batch 4, held after the gap (issue 37.5). Before, batch 3 was accepted."""
    made = files(tmp_path / "grind", SMALL, 4)
    verdicts = judge_all([made[2], made[3]], SMALL)
    assert [v.verdict for v in verdicts] == ["soft_invalidate"] * 2, [v.reasons for v in verdicts]
    assert "selection: batch counter 3 where 1 was due" in verdicts[0].reasons[0]
    assert "is held" in verdicts[1].reasons[0]
    # and a restarted workload carries on from the counters it wrote (a repeated counter is a slash)
    again = InferenceWorkload(InferenceSettings(node_address=NODE, output_dir=tmp_path / "grind",
                                                batch_size=1, n=4, max_new_tokens=16,
                                                target_lengths=[8]))  # fmt: skip
    report = again.run_batch()
    assert report is not None and report.batch_counter == 5


def test_a_rejected_file_still_uses_its_counter_and_a_retry_is_not_counted_twice(tmp_path: Path) -> None:
    """Issue 37.3: counters were recorded only for files that passed every check, so after any
    invalidate (or a soft verdict) a node's next honest file looked like a gap and was not paid as
    "grinding" (5 times in a run of the attack suite). Every file with a readable header counts now.
    A file judged again after an error of the validator's (its seen-store never wrote it) is the same
    file: not a second counter."""
    made = files(tmp_path / "made", SMALL, 3)
    forged = edit_logprobs(made[0], tmp_path / "forged.parquet",
                           lambda i, r: [lp - 1.0 for lp in r.output_logprobs])  # fmt: skip
    windows = MemoryNodeWindows()
    pipeline = InferenceJudge(SMALL, MemorySeenStore(), ModelCheckpoints(SMALL.model), windows=windows)
    first = pipeline.judge(forged, Submission(node=NODE))
    assert first.verdict == "invalidate", first.reasons
    second = pipeline.judge(made[1], Submission(node=NODE))
    assert second.verdict == "accept", second.reasons  # counter 2 after counter 1, whatever 1's verdict
    # the same file judged again by a validator whose seen-store lost it (a crash before it wrote)
    again = InferenceJudge(SMALL, MemorySeenStore(), ModelCheckpoints(SMALL.model), windows=windows)
    assert again.judge(made[1], Submission(node=NODE)).verdict == "accept"
    third = again.judge(made[2], Submission(node=NODE))
    assert third.verdict == "accept", third.reasons
