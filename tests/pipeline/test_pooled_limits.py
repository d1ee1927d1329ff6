"""The pooled limits (`workloads/pipeline/judge/pooled.py`, `TINY_POOLED`) on measured figures, through the
validator's own window code (`PipelineJudge._pooled_verdict`), without member processes or a model:

- the honest files of `intellect devnet fire`'s group of 2 (an RL run's batches: 16 prompts × 4
  completions, up to 16 tokens, the base model then the trainer's checkpoints), whose first file the
  limits before were calibrated without (its last stage end to end at 0.453 against 0.45: not paid);
- bench/pipeline_pooled.py's windows at that shape (honest groups on the base model, the fire run's
  step 4 and a policy trained far from the base; the weakest perturbed-weights cheater at each stage
  position): every honest member paid and never blamed, every cheater blamed and no one else.

Fixtures: tests/fixtures/pipeline_pooled/ (per batch, every stage's end-to-end [chunks, sum of chunk
mantissa-error means] and each member's own; how they were made is in each file's `source`)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from intellect.wire.verdicts import Submission
from intellect.workloads import MemoryNodeWindows
from workloads.pipeline.judge.end_to_end import StageStats
from workloads.pipeline.judge.file_judge import PipelineJudge
from workloads.pipeline.judge.pooled import TINY_POOLED, PooledLimits, pooled_blame, pooled_mean
from workloads.pipeline.judge.replay import MemberVerdict
from workloads.pipeline.selfcheck import SelfLimits

FIXTURES = Path(__file__).parents[1] / "fixtures" / "pipeline_pooled"
NODES = [f"0x{i:040x}" for i in range(1, 4)]
# The limits this file's first test caught (the one set for both rules, calibrated on the base model's
# `demo` windows only): the fire run's first file was not paid under them.
BEFORE = PooledLimits(inner_mean=0.3, last_mean=0.45, min_chunks=16, pay_inner=0.3, pay_last=0.45,
                      pay_chunks=16, base_inner=0.05, base_last=0.25, amplification=4.0)  # fmt: skip


def judge_windows(batches: list[dict[str, Any]], members: int) -> list[list[str]]:
    """Each member's verdict on each batch, in order, as `PipelineJudge.judge` reaches it for a file that
    passed every other check: guilty by the file rules (`guilty`) → invalidate; failed end to end → not
    paid; otherwise its window is fed and judged (`_pooled_verdict`, the validator's code): its own
    figures out → invalidate, the batch's out → soft_invalidate, else accept."""
    judge = PipelineJudge.__new__(PipelineJudge)  # the window code only: no model, no dataset
    judge.windows = MemoryNodeWindows()
    verdicts = []
    for n, batch in enumerate(batches):
        stats = [StageStats(int(c), float(m)) for c, m in batch["stats"]]
        row = []
        for k in range(members):
            if k in batch.get("guilty", []):
                row.append("invalidate")
                continue
            if not batch.get("accepted", True):
                row.append("soft_invalidate")
                continue
            own = batch["own"][k]
            local = MemberVerdict(proven=own is not None, stats=StageStats(int(own[0]), float(own[1]))
                                  if own else StageStats())  # fmt: skip
            data = SimpleNamespace(task_id="task-1", group_id="group-1", members=NODES[:members], stage=k,
                                   node=NODES[k])  # fmt: skip
            submission = Submission(node=NODES[k], pool_id=1)
            paid, mine = judge._pooled_verdict(data, submission, f"batch-{n}", stats, local)
            row.append("invalidate" if mine.out else "soft_invalidate" if paid.out else "accept")
        verdicts.append(row)
    return verdicts


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def test_the_fire_runs_honest_group_of_2_is_paid_for_every_file_and_never_blamed() -> None:
    fire = load("fire_group_of_2.json")
    batches = fire["batches"]
    first = [StageStats(int(c), float(m)) for c, m in batches[0]["stats"]]
    assert pooled_mean(first[1]) > BEFORE.pay_last  # 0.453: what the validators refused to pay
    assert pooled_blame(first, 1, BEFORE).out
    verdicts = judge_windows(batches, fire["members"])
    assert all(v == "accept" for row in verdicts for v in row), verdicts


def test_honest_members_of_a_trainers_group_are_never_blamed_nor_left_unpaid() -> None:
    """Honest windows at the devnet's shape, 2 and 3 members, on the base model, the fire run's step 4 and
    a policy far from the base (its last stage end to end up to 0.98 in one 16-chunk file)."""
    windows = load("bench_windows.json")
    honest = [w for w in windows["sequences"] if w["cheat_stage"] < 0]
    assert {w["weights"] for w in honest} == {"base", "step_4", "drifted"}
    for w in honest:
        verdicts = judge_windows(w["batches"], w["members"])
        assert all(v == "accept" for row in verdicts for v in row), (w["weights"], w["members"], verdicts)


@pytest.mark.parametrize(("members", "stage"), [(2, 0), (2, 1), (3, 0), (3, 1), (3, 2)])
def test_the_weakest_perturbed_weights_cheater_is_blamed_and_no_one_else(members: int, stage: int) -> None:
    """The measured sequence whose own pooled figure stayed lowest, per position, over every checkpoint:
    blamed (its own window, or its files), within its files; the honest members never blamed."""
    windows = load("bench_windows.json")
    found = [w for w in windows["sequences"] if (w["members"], w["cheat_stage"]) == (members, stage)]
    assert found
    for w in found:
        verdicts = judge_windows(w["batches"], members)
        mine = [row[stage] for row in verdicts]
        assert "invalidate" in mine, (w["weights"], mine)
        others = [row[k] for row in verdicts for k in range(members) if k != stage]
        assert "invalidate" not in others, (w["weights"], verdicts)


def test_a_member_holds_itself_to_its_own_figures_limits_inside_the_validators() -> None:
    """The self-check (`selfcheck.py`) pools the member's own figures, which `pooled_own` judges: its
    limit at each stage position is the validator's at its margin, and every honest own window measured
    (from its first file: a member's window starts with its own first file) stays under it."""
    held = SelfLimits()
    windows = load("bench_windows.json")
    for w in windows["sequences"]:
        members = w["members"]
        for k in range(members):
            last = k == members - 1
            assert held.pooled_limit(k, last) < TINY_POOLED.own_limit(k, last)
            if w["cheat_stage"] >= 0:
                continue
            chunks, mant = 0, 0.0
            for batch in w["batches"]:
                own = batch["own"][k]
                if own is None:
                    continue
                chunks, mant = chunks + int(own[0]), mant + float(own[1])
                if chunks >= TINY_POOLED.min_chunks:
                    figure = mant / chunks
                    assert figure <= held.pooled_limit(k, last), (w["weights"], members, k, figure)
