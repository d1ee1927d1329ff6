"""Selection among outcomes is not paid (issue 37.5). Before, a node stopped each step before its first
below-median batch (counters restarted at every step, so no gap showed: 4 of 4 accepted, task reward
0.555 against 0.428 for all it made), or chose which of the async window's step labels carried its
next batch (each label was another plan: 0.469 against 0.375 and 0.406). Now the plan is (task, node,
counter), counters run over the whole task, a gap holds the node's next HOLD counters unpaid, and a
node's labels and checkpoints do not go back (workloads/inference/judge/checks/history.py; the
figures of both cheats, before and after: bench/selection.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from intellect.wire.verdicts import Submission
from intellect.workloads import MemoryNodeWindows, MemorySeenStore
from workloads.inference.judge.checks import history
from workloads.inference.judge.checks.context import FileContext
from workloads.inference.judge.checks.history import counter_order
from workloads.inference.judge.pipeline import Pipeline
from workloads.inference.judge.thresholds import ValidationThresholds
from workloads.inference.selection import plan_batch
from workloads.inference.settings import InferenceSettings
from workloads.inference.task import TaskSettings
from workloads.inference.workload import InferenceWorkload
from workloads.model.loading import ModelCheckpoints
from workloads.rollouts import BatchInfo, read_rollouts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_statistics import NODE, SMALL  # noqa: E402


class Rule:
    """`counter_order` alone, on headers only: one validator's memory of one node."""

    def __init__(self) -> None:
        self.windows = MemoryNodeWindows()

    def __call__(self, counter: int, step: int = 0, checkpoint: int | None = 0, unknown: int = 0,
                 file: str | None = None) -> list[str]:  # fmt: skip
        info = BatchInfo(node_address=NODE, step=step, batch_counter=counter, group_size=1, max_new_tokens=1,
                         checkpoint_step=checkpoint, task_id="t")  # fmt: skip
        ctx = FileContext(
            path=Path("x"), submission=Submission(node=NODE, counters_unknown=unknown), task=TaskSettings(),
            thresholds=ValidationThresholds(), records=[], tokenizer=None,  # type: ignore[arg-type]
            seen=MemorySeenStore(), checkpoints=ModelCheckpoints(), vocab_size=0,
            sha256=file or f"file-{counter}-{step}-{checkpoint}", info=info,
        )  # fmt: skip
        return counter_order(ctx, self.windows)


def test_counters_run_over_the_task_and_a_withheld_batch_costs_the_next_hold() -> None:
    rule = Rule()
    assert rule(1, step=0) == [] and rule(2, step=0) == []
    assert rule(3, step=1) == []  # a new step goes on counting: a step's end is no way out of a batch
    # counter 4 was bad and withheld: 5 is a gap, and so are the next HOLD counters unpaid
    assert "where 4 was due" in rule(5, step=1)[0]
    held = [rule(c, step=2) for c in range(6, 5 + history.HOLD + 1)]
    assert all(r and "is held" in r[0] for r in held), held
    assert rule(5 + history.HOLD + 1, step=2) == []  # paid again after the hold


def test_what_the_validator_never_read_allows_a_skip_without_a_hold() -> None:
    rule = Rule()
    assert rule(1) == []
    assert rule(3, unknown=1) == []  # counter 2's file was kept from this validator (storage down)
    assert rule(4) == []
    assert rule(4, file="file-4-0-0") == []  # the same file judged again: not a second counter


def test_labels_and_checkpoints_do_not_go_back() -> None:
    rule = Rule()
    assert rule(1, step=3, checkpoint=2) == []
    assert rule(2, step=3, checkpoint=3) == []
    back = rule(3, step=3, checkpoint=2)  # the next batch made with the older checkpoint of the window
    assert back and "checkpoints do not go back" in back[0]
    label = rule(4, step=2, checkpoint=3)
    assert label and "labels do not go back" in label[0]
    assert rule(5, step=4, checkpoint=4) == []


def test_a_label_changes_no_prompt_and_no_seed(tmp_path: Path) -> None:
    """The same counter made under two labels of the window: the same prompts and sampling seeds."""
    made = []
    for step in (0, 2):
        workload = InferenceWorkload(InferenceSettings(
            node_address=NODE, output_dir=tmp_path / f"label-{step}", step=step, batch_size=2, n=2,
            max_new_tokens=4, target_lengths=[4], proofs=False))  # fmt: skip
        made.append(read_rollouts(Path(workload.run_batch().path)))  # type: ignore[union-attr]
    (rows_a, info_a), (rows_b, info_b) = made
    assert (info_a.step, info_b.step, info_a.batch_counter, info_b.batch_counter) == (0, 2, 1, 1)
    assert [(r.input_tokens, r.seed) for r in rows_a] == [(r.input_tokens, r.seed) for r in rows_b]
    plan = plan_batch(NODE, 1, 512, 2, 2, [4])
    assert [r.seed for r in rows_a] == plan.seeds


@pytest.mark.parametrize("hold", [2])
def test_the_stop_before_a_bad_batch_cheat_is_not_paid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        hold: int) -> None:  # fmt: skip
    """Real files of the inference workload over two steps: counters go on across the step, the
    honest sequence is paid, and the cheater's sequence (counter 2 withheld) pays nothing from the gap
    to the end of the hold (HOLD set to 2 here to keep the files few)."""
    monkeypatch.setattr(history, "HOLD", hold)
    out = tmp_path / "node"
    made = []
    for step, count in ((0, 3), (1, 3)):
        workload = InferenceWorkload(InferenceSettings(
            node_address=NODE, output_dir=out, step=step, batch_size=1, n=4, max_new_tokens=16,
            target_lengths=[8]))  # fmt: skip
        made += [Path(workload.run_batch().path) for _ in range(count)]  # type: ignore[union-attr]
    headers = [read_rollouts(p)[1] for p in made]
    assert [(h.step, h.batch_counter) for h in headers] == [(0, 1), (0, 2), (0, 3), (1, 4), (1, 5), (1, 6)]

    def judged(paths: list[Path]) -> list[str]:
        pipeline = Pipeline(SMALL, MemorySeenStore(), ModelCheckpoints(SMALL.model),
                            windows=MemoryNodeWindows())
        return [pipeline.judge(p, Submission(node=NODE)).verdict for p in paths]

    assert judged(made) == ["accept"] * 6  # the honest node: every file paid
    cheater = [made[0], *made[2:]]  # withholds counter 2
    assert judged(cheater) == ["accept", "soft_invalidate", "soft_invalidate", "soft_invalidate", "accept"]
