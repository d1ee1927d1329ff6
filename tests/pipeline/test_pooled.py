"""The pooled per-stage check (`workloads/pipeline/judge/pooled.py`) through the plug-in's judge, on files
real group members wrote as tasks: a member running perturbed weights is blamed within a few files at
every stage position, and only it; honest groups over the same files are always paid; a member's
window is fed only by its own files and survives a validator restart on the SQL store."""

from __future__ import annotations

from pathlib import Path

import pytest

from intellect.wire.verdicts import Submission
from intellect.workloads import MemoryNodeWindows, MemorySeenStore, NodeWindows, ValidatorEnv
from tests.pipeline.test_task import NODES, run_group
from validator.store import Database, SqlNodeWindows, open_database
from workloads.pipeline.files import file_name
from workloads.pipeline.judge.end_to_end import StageStats
from workloads.pipeline.judge.file_judge import PipelineJudge
from workloads.pipeline.judge.pooled import TINY_POOLED, pooled_blame
from workloads.pipeline.settings import PipelineSettings

pytestmark = pytest.mark.slow  # each group is 2-3 member processes loading the model

FILES = 4  # batches per group: 8 rows x 32 tokens, at least 8 chunks per stage and file
BLAME_WITHIN = 3  # files of the cheater's after which it is blamed (2 for the pooled minimum of 16 chunks)
SETTINGS = {"batch_size": 8, "batches": FILES, "max_new_tokens": 32}


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int], list[list[Path]]]:
    """Per (members, perturbed stage or -1): each batch's files, in stage order."""
    made = {}
    for members, stage in [(2, -1), (3, -1), (2, 0), (2, 1), (3, 1), (3, 2)]:
        folder = tmp_path_factory.mktemp(f"group-{members}-{stage}")
        cheat = "weights" if stage >= 0 else "none"
        dirs = run_group(folder, members, SETTINGS, cheat_stage=stage, cheat=cheat)
        made[(members, stage)] = [[dirs[i] / file_name(b, i) for i in range(members)]
                                  for b in range(1, FILES + 1)]  # fmt: skip
    return made


def judge_files(judge: PipelineJudge, batches: list[list[Path]]) -> list[list[tuple[str, list[str]]]]:
    """Every member's file of every batch, batch by batch (the order a validator sees them on chain)."""
    return [[(v.verdict, v.reasons) for v in (judge.judge(path, Submission(node=NODES[i], pool_id=1))
                                              for i, path in enumerate(files))]
            for files in batches]  # fmt: skip


def new_judge(tmp: Path, windows: NodeWindows | None = None) -> PipelineJudge:
    env = ValidatorEnv(seen=MemorySeenStore(), data_dir=tmp, task_id="task-1",
                       windows=windows or MemoryNodeWindows())
    return PipelineJudge(PipelineSettings(**SETTINGS), env)


@pytest.mark.parametrize(("members", "stage"), [(2, 0), (2, 1), (3, 1), (3, 2)])
def test_a_member_with_perturbed_weights_is_blamed_within_a_few_files_and_only_it(
    groups: dict[tuple[int, int], list[list[Path]]], members: int, stage: int, tmp_path: Path
) -> None:
    verdicts = judge_files(new_judge(tmp_path), groups[(members, stage)])
    for b, batch in enumerate(verdicts):
        for i, (kind, reasons) in enumerate(batch):
            if i != stage:
                assert kind != "invalidate", (b, i, reasons)  # an honest member is never slashed
    own = [batch[stage][0] for batch in verdicts]
    first = own.index("invalidate") if "invalidate" in own else None
    assert first is not None and first < BLAME_WITHIN, own
    assert own[first:] == ["invalidate"] * (FILES - first), own  # blamed from then on
    if stage == members - 1:  # the last stage: one file is inside the per-chunk envelope; its window blames
        reasons = verdicts[first][stage][1]
        assert any(r.startswith(f"pooled: stage {stage}'s mean mantissa error") for r in reasons), reasons
    elif stage > 0:  # a middle stage: the whole-vector comparison of what it sent (`replay.py`) or its window
        reasons = " ".join(verdicts[first][stage][1])
        assert "what its layers make of what it received" in reasons or "pooled: stage" in reasons, reasons


@pytest.mark.parametrize("members", [2, 3])
def test_honest_groups_over_the_same_files_are_always_paid(
    groups: dict[tuple[int, int], list[list[Path]]], members: int, tmp_path: Path
) -> None:
    verdicts = judge_files(new_judge(tmp_path), groups[(members, -1)])
    assert all(kind == "accept" for batch in verdicts for kind, _ in batch), verdicts


def test_a_members_window_is_fed_by_its_own_files_only(
    groups: dict[tuple[int, int], list[list[Path]]], tmp_path: Path
) -> None:
    """Stage 0 of a group whose stage 1 lies: judging stage 0's files writes into stage 0's window only;
    stage 1's own first file, judged afterwards, is pooled over that one file and paid."""
    windows = MemoryNodeWindows()
    judge = new_judge(tmp_path, windows)
    batches = groups[(2, 1)]
    for files in batches:
        judge.judge(files[0], Submission(node=NODES[0], pool_id=1))
    assert set(windows.windows) == {(1, NODES[0].lower())}
    got = judge.judge(batches[0][1], Submission(node=NODES[1], pool_id=1))
    assert got.verdict == "accept", got.reasons


def test_the_window_survives_a_validator_restart_on_the_sql_store(
    groups: dict[tuple[int, int], list[list[Path]]], tmp_path: Path
) -> None:
    """The last stage of 2 with perturbed weights: its second file alone is paid by a fresh validator
    (too few chunks to pool); after a restart that keeps the SQL windows, the same file is blamed."""
    batches = groups[(2, 1)]
    alone = new_judge(tmp_path / "fresh").judge(batches[1][1], Submission(node=NODES[1], pool_id=1))
    assert alone.verdict == "accept", alone.reasons
    first = new_judge(tmp_path, SqlNodeWindows(Database(open_database(None, tmp_path / "db"))))
    assert first.judge(batches[0][1], Submission(node=NODES[1], pool_id=1)).verdict == "accept"
    restarted = new_judge(tmp_path, SqlNodeWindows(Database(open_database(None, tmp_path / "db"))))
    got = restarted.judge(batches[1][1], Submission(node=NODES[1], pool_id=1))
    assert got.verdict == "invalidate" and "over its last 2 files" in got.reasons[0], got.reasons


def test_the_pooled_rule_blames_nobody_when_an_earlier_stage_is_not_clean() -> None:
    """The end-to-end rule names no stage that may only amplify an earlier member's small lie: over the
    same files the earlier stage deviates (below `pay_inner`, so not out itself) by enough to explain the
    later stage's excess at the measured amplification. (The validator names nobody on these figures in
    any case: out, the batch is only not paid.)"""
    lim, n = TINY_POOLED, TINY_POOLED.pay_chunks
    small_lie = lim.base_inner + 0.2  # under pay_inner: its stage is not out
    later = lim.base_last + 5.0 * 0.2  # amplified ×5 (more than the ×4.9 measured): over pay_last
    verdict = pooled_blame([StageStats(n, n * small_lie), StageStats(n, n * later)], 4)
    assert small_lie <= lim.pay_inner < lim.pay_last < later
    assert verdict.out and verdict.blamed is None and "nobody blamed" in verdict.reasons[0]
    own = [StageStats(n, n * 0.05), StageStats(n, n * (lim.pay_inner + 0.2)), StageStats(n, n * 2.0)]
    assert pooled_blame(own, 4).blamed == 1  # the middle stage's own lie, amplified after it
    assert not pooled_blame([StageStats(n - 1, (n - 1) * 5.0), StageStats(0, 0.0)], 4).out  # too few
