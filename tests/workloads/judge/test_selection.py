"""Selection among outcomes is not paid (issue 37.5). Before, a node stopped each step before its first
below-median batch (counters restarted at every step, so no gap showed: 4 of 4 accepted, task reward
0.555 against 0.428 for all it made), or chose which of the async window's step labels carried its
next batch (each label was another plan: 0.469 against 0.375 and 0.406). Now the plan is (task, node,
counter), counters run over the whole task, a gap holds the node's next HOLD counters unpaid, and a
node's labels and checkpoints do not go back (workloads/inference/judge/checks/history.py; the
figures of both cheats, before and after: bench/selection.py). Issue 54: a batch submitted so that it
is not judged on its merits (a stale step label, a checkpoint the trainer never had) or never read
by the validator used its counter without a gap, so a node dropped the batches it chose at no cost;
such a counter now counts as a withheld batch: the next file and the HOLD after it are held."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from intellect.wire.verdicts import Submission, Verdict
from intellect.workloads import MemoryNodeWindows, MemorySeenStore
from workloads.inference.judge.checks import history
from workloads.inference.judge.checks.context import FileContext
from workloads.inference.judge.checks.history import counter_order, forfeit
from workloads.inference.judge.file_judge import InferenceJudge
from workloads.inference.judge.thresholds import ValidationThresholds
from workloads.inference.selection import plan_batch
from workloads.inference.settings import InferenceSettings
from workloads.inference.task import TaskSettings
from workloads.inference.workload import InferenceWorkload
from workloads.model.loading import ModelCheckpoints, base_checkpoint_sha256, resolve
from workloads.rollouts import BatchInfo, read_rollouts, write_rollouts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_statistics import NODE, SMALL  # noqa: E402


class Rule:
    """`counter_order` alone, on headers only: one validator's memory of one node."""

    def __init__(self) -> None:
        self.windows = MemoryNodeWindows()

    def context(self, counter: int, step: int = 0, checkpoint: int | None = 0, unknown: int = 0,
                file: str | None = None) -> FileContext:  # fmt: skip
        info = BatchInfo(node_address=NODE, step=step, batch_counter=counter, group_size=1, max_new_tokens=1,
                         checkpoint_step=checkpoint, task_id="t")  # fmt: skip
        return FileContext(
            path=Path("x"), submission=Submission(node=NODE, counters_unknown=unknown), task=TaskSettings(),
            thresholds=ValidationThresholds(), records=[], tokenizer=None,  # type: ignore[arg-type]
            seen=MemorySeenStore(), checkpoints=ModelCheckpoints(), vocab_size=0,
            sha256=file or f"file-{counter}-{step}-{checkpoint}", info=info,
        )  # fmt: skip

    def __call__(self, counter: int, step: int = 0, checkpoint: int | None = 0, unknown: int = 0,
                 file: str | None = None, soft: list[str] | None = None) -> list[str]:  # fmt: skip
        """The file's selection reasons; with `soft`, the file is then judged soft for those reasons
        (as the pipeline ends a judgment), and what `forfeit` says (why, or "not forfeited") follows."""
        ctx = self.context(counter, step, checkpoint, unknown, file)
        reasons = counter_order(ctx, self.windows)
        if soft is None:
            return reasons
        return [*reasons, f"forfeit: {forfeit(ctx, self.windows, soft) or 'not forfeited'}"]


def test_counters_run_over_the_task_and_a_withheld_batch_costs_the_next_hold() -> None:
    rule = Rule()
    assert rule(1, step=0) == [] and rule(2, step=0) == []
    assert rule(3, step=1) == []  # a new step goes on counting: a step's end is no way out of a batch
    # counter 4 was bad and withheld: 5 is a gap, and so are the next HOLD counters unpaid
    assert "where 4 was due" in rule(5, step=1)[0]
    held = [rule(c, step=2) for c in range(6, 5 + history.HOLD + 1)]
    assert all(r and "is held" in r[0] for r in held), held
    assert rule(5 + history.HOLD + 1, step=2) == []  # paid again after the hold


def test_a_file_storage_kept_from_the_validator_allows_a_skip_and_no_hold() -> None:
    """A file storage kept from the validator until its deadline (`counters_unknown`) may have used the
    next counter: the skip is allowed, and nothing is held (storage is the pool's, not the node's; a
    file the node made too big to read is no unread file: tests/validator/test_judge_order.py)."""
    rule = Rule()
    assert rule(1) == []
    assert rule(3, unknown=1) == []  # counter 2's file was kept from this validator
    assert [rule(c) for c in range(4, 4 + history.HOLD)] == [[]] * history.HOLD
    other = Rule()
    assert other(1) == [] and "where 2 to 3 was due" in other(5, unknown=1)[0]  # one unread, one skip


def test_a_counter_not_judged_on_its_merits_holds_the_next_ones() -> None:
    """The forfeit rule on headers only: a file soft-invalidated for a reason the node can cause uses
    its counter and counts as a withheld batch (the next file and the HOLD after it are held); the
    hold's own reasons (a gap, a held counter) never extend it; a re-judged forfeit counts once, and
    the latest judgment of a file decides."""
    rule = Rule()
    stale = ["freshness: step 0 is behind the trainer's window [2, 4] at submission (async level 2)"]
    assert rule(1) == [] and rule(2) == []
    said = rule(3, soft=stale)
    assert said == ["forfeit: stale step label"], said
    assert rule(3, file="file-3-0-0", soft=stale) == said  # judged again (the validator crashed): the same
    held = [rule(c) for c in range(4, 4 + history.HOLD + 1)]
    assert all(len(r) == 1 and "is held: counter 3 was not judged on its merits (stale step label)" in r[0]
               for r in held), held  # fmt: skip
    assert rule(4 + history.HOLD + 1) == []  # paid again
    # held files are soft for the hold's reason alone: marking them would extend the hold for ever
    rule = Rule()
    for c in range(2, 2 + history.HOLD + 1):  # counter 2 where 1 was due, then HOLD held
        reasons = rule(c)
        assert reasons and reasons[0].startswith(history.ORDER), reasons
        assert forfeit(rule.context(c), rule.windows, reasons) is None
    assert rule(2 + history.HOLD + 1) == []
    # a forfeit during a hold extends it (the node chose to drop that batch too)
    rule = Rule()
    unknown = ["freshness: no checkpoint of step 3 can be had from the trainer"]
    assert rule(1) == [] and rule(2, soft=unknown) == ["forfeit: a checkpoint the trainer does not have"]
    assert "is held" in rule(3)[0]
    during = rule(4, soft=stale)  # held, and a stale label: a forfeit all the same
    assert "is held" in during[0] and during[1] == "forfeit: stale step label", during
    held = [rule(c) for c in range(5, 5 + history.HOLD + 1)]
    assert all(r and "is held: counter 4 was not judged" in r[0] for r in held), held
    assert rule(5 + history.HOLD + 1) == []
    # the latest judgment of a file decides: soft then (validator error, judged again) accepted
    rule = Rule()
    assert rule(1, soft=stale) and rule(1, file="file-1-0-0") == []
    assert rule(2) == []


def test_a_batch_withheld_burnt_or_relabelled_costs_the_same() -> None:
    """Whatever way a node keeps batch 3 from being paid (not submitted, submitted but never readable,
    submitted with a stale label or a checkpoint the trainer never had, or going back a checkpoint),
    the same counters are paid: a way that costs less would be the one to select with."""
    last = 3 + history.HOLD + 4

    def paid(way: str) -> list[int]:
        rule, out = Rule(), []
        for c in range(1, last + 1):
            if c == 3 and way in ("withhold", "burn"):
                # burnt: submitted too big for the validator to read: a verdict of its own ("size:",
                # tests/validator/test_judge_order.py), not a file storage kept away, so no skip allowed
                continue
            soft = {"stale": ["freshness: step 0 is behind the trainer's window [2, 4] at submission"],
                    "gone": ["freshness: no checkpoint of step 1 can be had from the trainer"],
                    "back": ["selection: checkpoint of step 0 after this node's checkpoint of step 1"],
                    }.get(way) if c == 3 else None  # fmt: skip
            checkpoint = 0 if way == "back" and c == 3 else 1  # "back": the older checkpoint at 3 only
            reasons = rule(c, checkpoint=checkpoint, soft=soft)
            if not reasons:
                out.append(c)
        return out

    withheld = paid("withhold")
    assert withheld == [1, 2, *range(3 + 1 + history.HOLD + 1, last + 1)], withheld
    for way in ("burn", "stale", "gone", "back"):
        assert paid(way) == withheld, way


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
        pipeline = InferenceJudge(SMALL, MemorySeenStore(), ModelCheckpoints(SMALL.model),
                            windows=MemoryNodeWindows())
        return [pipeline.judge(p, Submission(node=NODE)).verdict for p in paths]

    assert judged(made) == ["accept"] * 6  # the honest node: every file paid
    cheater = [made[0], *made[2:]]  # withholds counter 2
    assert judged(cheater) == ["accept", "soft_invalidate", "soft_invalidate", "soft_invalidate", "accept"]


COUNT = 13  # honest batches for the sequences below: 2 paid, a relabelled one, HOLD + 1 held, one paid
TRAINER_AT = 4  # the trainer's step at every submission: its window is [2, 4] (async level 2)


class Trainer:
    """The trainer's checkpoints as a validator can have them: step 2 (the base weights here, so the
    tiny model's batches are its own) and step 0; step 1 is gone (or never was)."""

    def checkpoint_for(self, step: int) -> tuple[Path, str] | None:
        sha = base_checkpoint_sha256(SMALL.model)
        assert sha is not None
        return (Path(resolve(SMALL.model)) / "model.safetensors", sha) if step == 2 else None


def relabel(src: Path, dst: Path, **update: object) -> Path:
    """The node writes the header it likes (the rows are the batch it made)."""
    rows, info = read_rollouts(src)
    if "step" in update:  # every row names its step too
        rows = [r.model_copy(update={"step": update["step"]}) for r in rows]
    write_rollouts(dst, rows, info.model_copy(update=update))
    return dst


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """A node's honest batches, counters 1..COUNT, labelled step 2 and made with checkpoint 2."""
    out = tmp_path_factory.mktemp("made")
    workload = InferenceWorkload(InferenceSettings(
        node_address=NODE, output_dir=out / "raw", batch_size=SMALL.batch_size, n=SMALL.n,
        max_new_tokens=SMALL.max_new_tokens, target_lengths=SMALL.target_lengths))  # fmt: skip
    raw = [Path(workload.run_batch().path) for _ in range(COUNT)]  # type: ignore[union-attr]
    return [relabel(p, out / f"honest-{i}.parquet", step=2, checkpoint_step=2) for i, p in enumerate(raw, 1)]


def judge_in_order(paths: list[Path]) -> list[Verdict]:
    """One validator of pool 1 judging a node's submissions in chain order."""
    pipeline = InferenceJudge(SMALL, MemorySeenStore(), ModelCheckpoints(SMALL.model, host=Trainer()),
                        windows=MemoryNodeWindows())  # fmt: skip
    return [pipeline.judge(p, Submission(node=NODE, pool_id=1, trainer_step=TRAINER_AT)) for p in paths]


def test_an_honest_sequence_is_all_paid(made: list[Path]) -> None:
    verdicts = judge_in_order(made)
    assert [v.verdict for v in verdicts] == ["accept"] * COUNT, [v.reasons for v in verdicts if v.reasons]


@pytest.mark.parametrize(("update", "said", "why"), [
    ({"step": 1, "checkpoint_step": 0}, "freshness: step 1 is behind the trainer's window [2, 4]",
     "stale step label"),
    ({"checkpoint_step": 1}, "freshness: no checkpoint of step 1 can be had",
     "a checkpoint the trainer does not have"),
])  # fmt: skip
def test_a_batch_relabelled_not_to_be_paid_holds_the_next_counters(
    made: list[Path], tmp_path: Path, update: dict[str, int], said: str, why: str
) -> None:
    """Issue 54: the node does not want batch 3 paid; it submits it labelled with a stale step, or with
    a checkpoint the trainer never had. Not paid, its counter used: before, no gap, no hold, and the
    batches it chose (all the others) were all paid. Now batch 3 counts as a withheld batch: the next
    file and the HOLD after it are held, and the node is paid again after them (the hold does not
    extend itself)."""
    hold = history.HOLD
    assert hold + 5 <= COUNT
    cheat = relabel(made[2], tmp_path / "relabelled.parquet", **update)
    verdicts = judge_in_order([*made[:2], cheat, *made[3 : 3 + hold + 2]])
    kinds = [v.verdict for v in verdicts]
    expected = ["accept"] * 2 + ["soft_invalidate"] * (2 + hold) + ["accept"]
    assert kinds == expected, [v.reasons for v in verdicts]
    relabelled = verdicts[2].reasons
    assert relabelled[0].startswith(said), relabelled  # its own reason, what the node chose
    for counter, verdict in enumerate(verdicts[3 : 3 + hold + 1], start=4):
        assert verdict.reasons == [verdict.reasons[0]], verdict.reasons  # held, and nothing else
        assert verdict.reasons[0].startswith(f"selection: batch counter {counter} is held: counter 3 was not "
                                             f"judged on its merits ({why})"), verdict.reasons  # fmt: skip
        assert f"paid again from counter {3 + hold + 2}" in verdict.reasons[0]


def test_a_relabelled_batch_judged_again_counts_once(made: list[Path], tmp_path: Path) -> None:
    """The validator judges the relabelled file twice (it crashed before recording the verdict): the
    same verdict, no duplicate of itself, and the hold ends where it would have."""
    hold = history.HOLD
    cheat = relabel(made[2], tmp_path / "stale.parquet", step=1, checkpoint_step=0)
    verdicts = judge_in_order([*made[:2], cheat, cheat, *made[3 : 3 + hold + 2]])
    assert verdicts[2].verdict == verdicts[3].verdict == "soft_invalidate"
    assert verdicts[2].reasons == verdicts[3].reasons, (verdicts[2].reasons, verdicts[3].reasons)
    kinds = [v.verdict for v in verdicts[4:]]
    assert kinds == ["soft_invalidate"] * (hold + 1) + ["accept"], [v.reasons for v in verdicts[4:]]
