"""Evidence weighed by its size, and history that never poisons (issue 54.4, 54.5), through the judge
`intellect-validator check` and `run` build (the inference plug-in's `file_judge`, its limits resolved
from the task model's record):

- one row failing far past anything honest (its proof made for another row, one token's logprob off by
  ten times the limit) is strong evidence alone, seen again before anyone is slashed; before, one or two
  such rows were only "marginal";
- a node whose small cheating files were caught pooled has its window closed behind the slash: its
  honest files after it are judged on their own evidence, never pooled with the cheat's statistics."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from intellect.wire.verdicts import Submission
from intellect.workloads import FileJudge, MemoryNodeWindows, MemorySeenStore, NoCheckpoints, ValidatorEnv
from workloads.inference.plugin import InferencePlugin
from workloads.inference.task import TaskSettings
from workloads.rollouts import read_rollouts, write_rollouts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_statistics import LONG, NODE, SMALL, edit_logprobs, files  # noqa: E402


def judge_for(task: TaskSettings, tmp: Path) -> FileJudge:
    """The judge `check` and `run` build for a task of these settings (limits: the tiny record)."""
    env = ValidatorEnv(seen=MemorySeenStore(), data_dir=tmp, checkpoints=NoCheckpoints(),
                       windows=MemoryNodeWindows())  # fmt: skip
    return InferencePlugin().file_judge(task, env)


WIDE = LONG.model_copy(update={"batch_size": 12})  # 48 rows: two bad rows move no file statistic


@pytest.fixture(scope="module")
def long_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return files(tmp_path_factory.mktemp("long"), WIDE, 1)[0]


def test_two_rows_whose_proofs_belong_to_each_other_are_slashed(long_file: Path, tmp_path: Path) -> None:
    """Two rows of one length swap their TOPLOC proofs: each row's proof is another row's. Two failing
    rows were "marginal" (strong takes three); a chunk with most of its exponents wrong is far past any
    honest chunk (the worst honest: 12 of 128 on every shipped shape), so the file is `invalidate`."""
    rows, info = read_rollouts(long_file)
    by_chunks: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_chunks.setdefault(len(r.proofs), []).append(i)
    a, b = next(v for k, v in sorted(by_chunks.items(), reverse=True) if len(v) >= 2 and k)[:2]
    swapped = list(rows)
    swapped[a] = rows[a].model_copy(update={"proofs": rows[b].proofs})
    swapped[b] = rows[b].model_copy(update={"proofs": rows[a].proofs})
    path = tmp_path / "swapped.parquet"
    write_rollouts(path, swapped, info)
    honest = judge_for(WIDE, tmp_path / "h").judge(long_file, Submission(node=NODE))
    assert honest.verdict == "accept", honest.reasons
    verdict = judge_for(WIDE, tmp_path / "v").judge(path, Submission(node=NODE))
    assert verdict.verdict == "invalidate", verdict.reasons
    why = " ".join(verdict.reasons)
    assert "far past honest noise" in why and "exponents wrong" in why and "seen again" in why, why
    assert verdict.judged_by is not None and verdict.judged_by.record == "tiny"


def test_one_token_ten_times_past_its_limit_is_slashed_one_ten_under_is_not(
    long_file: Path, tmp_path: Path
) -> None:
    """One token of one row: its logprob 6 nats off (12x the 0.5 limit) → `invalidate` on that row
    alone; 0.6 off (just past the limit, as an honest near tie can be) → one marginal row: not paid,
    never slashed."""
    rows, _ = read_rollouts(long_file)
    row = max(range(len(rows)), key=lambda i: len(rows[i].output_tokens))

    def moved(by: float):  # noqa: ANN202
        def edit(i: int, r):  # noqa: ANN001, ANN202
            lps = list(r.output_logprobs)
            if i == row:
                lps[2] -= by
            return lps

        return edit

    far = edit_logprobs(long_file, tmp_path / "far.parquet", moved(6.0))
    near = edit_logprobs(long_file, tmp_path / "near.parquet", moved(0.6))
    v_far = judge_for(WIDE, tmp_path / "a").judge(far, Submission(node=NODE))
    assert v_far.verdict == "invalidate", v_far.reasons
    assert any("far past honest noise" in r and f"row {row}" in r for r in v_far.reasons), v_far.reasons
    v_near = judge_for(WIDE, tmp_path / "b").judge(near, Submission(node=NODE))
    assert v_near.verdict == "soft_invalidate", v_near.reasons
    assert all("far past" not in r for r in v_near.reasons) and "marginal" in v_near.reasons[0]


def test_honest_files_after_a_caught_cheat_are_judged_on_their_own(tmp_path: Path) -> None:
    """One node, one run of counters: two small files with two outlier tokens each (0.2 nats off on one
    token of two rows: each file within its count of 2, the pair 4 against 2.016, caught pooled), then
    honest files. Before, the cheat's outliers stayed in the node's window and every honest file after
    it was `invalidate` "(pooled)" until they aged out (13 of 13 in the issue). The slash closes the
    window: every honest file after it is judged on its own evidence, and paid."""
    made = files(tmp_path / "files", SMALL, 8)

    def two_outliers(i: int, r):  # noqa: ANN001, ANN202
        lps = list(r.output_logprobs)
        if i < 2:
            lps[0] -= 0.2
        return lps

    cheats = [edit_logprobs(p, tmp_path / f"cheat-{k}.parquet", two_outliers) for k, p in enumerate(made[:2])]
    judge = judge_for(SMALL, tmp_path / "judge")
    first, caught = (judge.judge(p, Submission(node=NODE)) for p in cheats)
    assert first.verdict == "accept", first.reasons  # alone, within every limit: the small cheat's pay
    assert caught.verdict == "invalidate", caught.reasons
    assert any("(pooled)" in r and "by more than 0.15" in r for r in caught.reasons), caught.reasons
    assert "2 files in its window (" in caught.reasons[0]  # the window says what it holds
    after = [judge.judge(p, Submission(node=NODE)) for p in made[2:]]
    assert [v.verdict for v in after] == ["accept"] * 6, [v.reasons for v in after]
