"""Selection among outcomes, before and after issue 37.5: what a node gains by choosing which of the
batches it made are trained on and paid, under the old plan (step in the seed, counters per step)
and the new one (the plan is (task, node, counter); counters run over the task; a gap holds the next
8 counters unpaid; checkpoints and labels do not go back).

Real batches of the shipped tiny model on the demo's RL task (string reversal, 8 prompts × 4
completions, 16 new tokens), generated as the inference workload generates them; the trainer's
checkpoint after one step is the test data of tests/workloads/judge/data (a step of a demo run).

1. Label choice (cheat b). Old: each of the async window's 3 labels gave another plan, so a node
   made its next batch under each and kept the best. New: a label changes only the checkpoint (the
   older, base here, or the newer, step 1: the prompts and seeds stay), and a node's labels and
   checkpoints do not go back. Three cheaters, every submitted file judged by the validator's own
   rule (`counter_order`, workloads/inference/judge/checks/history.py) and only paid files counted:
   - best of two per batch: makes each batch with both checkpoints and submits the better, going
     back to the older one whenever it is better (what 0.095 measured before the rule was applied);
   - greedy switch: at each new step (every `--per-step` batches a new checkpoint appears), stays on
     the older checkpoint while it gives the better batch and moves on at the first batch the newer
     gives more (once moved, it cannot go back): the one choice the rule leaves, when to move on;
   - best switch (holds a step's batches, looks ahead): moves on at the counter that maximises what
     it is paid for that step.
   Against an honest node that makes every batch with the newest checkpoint it has.
2. Stopping before a bad batch (cheat a). Old: counters restarted each step, so a node stopped each
   step before its first below-median batch and lost nothing (no gap). New: the bad batch is still
   its next counter; withheld, it is a gap and the next 8 counters are unpaid too (the counter rule
   of workloads/inference/judge/checks/history.py, run here on the same sequence).

    .venv/bin/python bench/selection.py [--batches 24] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from intellect.wire.verdicts import Submission  # noqa: E402
from intellect.workloads import MemoryNodeWindows, MemorySeenStore, NoCheckpoints  # noqa: E402
from workloads.datasets import load_dataset  # noqa: E402
from workloads.inference.generate import make_rollouts  # noqa: E402
from workloads.inference.judge.checks.context import FileContext  # noqa: E402
from workloads.inference.judge.checks.history import HOLD, counter_order  # noqa: E402
from workloads.inference.judge.thresholds import ValidationThresholds  # noqa: E402
from workloads.inference.selection import SEED_HIGH, BatchPlan, plan_batch  # noqa: E402
from workloads.inference.task import TaskSettings  # noqa: E402
from workloads.model.backends import TorchBackend  # noqa: E402
from workloads.model.loading import load_model, load_tokenizer, load_weights  # noqa: E402
from workloads.rollouts import BatchInfo  # noqa: E402

NODE = "0x" + "5a" * 20
TASK = "bench-selection"
STEP_1 = REPO / "tests" / "workloads" / "judge" / "data" / "demo-near-tie" / "step_1.safetensors"
BATCH, N, NEW = 8, 4, 16


def old_plan(counter: int, step: int, size: int) -> BatchPlan:
    """The plan before 37.5: rng([node × counter + step, salt])."""
    import hashlib

    salt = int.from_bytes(hashlib.sha256(TASK.encode()).digest()[:16], "big")
    rng = np.random.default_rng([int(NODE, 16) * counter + step, salt])
    indexes = rng.integers(0, size, BATCH)
    seeds = rng.integers(0, SEED_HIGH, BATCH * N, dtype=np.int64)
    targets = rng.choice(np.asarray([8], dtype=np.int64), BATCH)
    return BatchPlan(indexes=[int(i) for i in indexes], seeds=[int(s) for s in seeds],
                     target_lengths=[int(t) for t in targets], n=N)  # fmt: skip


def reward(backend: TorchBackend, tokenizer, records, plan: BatchPlan) -> float:  # noqa: ANN001
    rows, _ = make_rollouts(backend, tokenizer, records, plan, step=1, max_new_tokens=NEW, temperature=1.0,
                            length_penalty=0.0, with_proofs=False)  # fmt: skip
    return statistics.fmean(r.task_rewards for r in rows)


def paid_under_hold(submitted: list[int]) -> list[int]:
    """The counters the new rule pays, for a node submitting `submitted` (in order)."""
    paid, previous, held_until = [], 0, 0
    for counter in submitted:
        if counter > previous + 1:
            held_until = max(held_until, counter + HOLD)
        elif counter > held_until:
            paid.append(counter)
        previous = counter
    return paid


def paid_by_the_rule(labels: list[int], tokenizer) -> list[bool]:  # noqa: ANN001
    """Which of a node's files (counters 1, 2, ...; file i made with checkpoint and label
    `labels[i]`) the validator's selection rule leaves payable."""
    windows, paid = MemoryNodeWindows(), []
    for counter, label in enumerate(labels, start=1):
        info = BatchInfo(node_address=NODE, step=label, batch_counter=counter, group_size=N,
                         max_new_tokens=NEW, checkpoint_step=label, task_id=TASK)  # fmt: skip
        ctx = FileContext(path=Path("bench"), submission=Submission(node=NODE), task=TaskSettings(),
                          thresholds=ValidationThresholds(), records=[], tokenizer=tokenizer,
                          seen=MemorySeenStore(), checkpoints=NoCheckpoints(), vocab_size=0,
                          sha256=f"bench-{counter}", info=info)  # fmt: skip
        paid.append(not counter_order(ctx, windows))
    return paid


def label_cheats(older: list[float], newer: list[float], per_step: int,
                 tokenizer) -> dict[str, dict[str, float | int]]:  # noqa: ANN001
    """Each cheater's files judged by the rule. Step k's batches (`per_step` counters) can be made
    with checkpoint k (older) or k + 1 (newer, just published); an honest node makes them all with
    k + 1. A paid file counts its reward; a file the rule refuses is made and not paid (0)."""
    count = len(older)
    steps = [list(range(start, min(start + per_step, count))) for start in range(0, count, per_step)]
    plans: dict[str, list[int]] = {"best of two per batch": [], "greedy switch": [], "best switch": []}
    for k, block in enumerate(steps):
        plans["best of two per batch"] += [k if older[i] >= newer[i] else k + 1 for i in block]
        greedy, moved = [], False
        for i in block:
            moved = moved or newer[i] > older[i]
            greedy.append(k + 1 if moved else k)
        plans["greedy switch"] += greedy
        gains = [sum(older[i] for i in block[:cut]) + sum(newer[i] for i in block[cut:])
                 for cut in range(len(block) + 1)]  # fmt: skip
        cut = int(np.argmax(gains))
        plans["best switch"] += [k] * cut + [k + 1] * (len(block) - cut)
    # The honest yardstick is the better of the two fixed schedules (all older, all newer): an honest
    # node may lag a step (the async window allows it), so what a cheater gains by *choosing* is what
    # it is paid beyond the best it could have had without looking at any outcome.
    honest = max(statistics.fmean(newer), statistics.fmean(older))
    out: dict[str, dict[str, float | int]] = {
        "honest": {"paid": count, "mean_paid": honest, "mean_newer": statistics.fmean(newer),
                   "mean_older": statistics.fmean(older)},
    }  # fmt: skip
    for name, labels in plans.items():
        paid = paid_by_the_rule(labels, tokenizer)
        rewards = [(older if labels[i] == i // per_step else newer)[i] for i in range(count)]
        got = [r for r, ok in zip(rewards, paid, strict=True) if ok]
        out[name] = {"paid": len(got), "mean_paid": statistics.fmean(got) if got else 0.0,
                     "gain_per_made_batch": sum(got) / count - honest,
                     "gain_of_paid_mean": (statistics.fmean(got) if got else 0.0) - honest}  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--per-step", type=int, nargs="+", default=[2, 4, 8],
                        help="batches a node makes per trainer step (a new checkpoint every that many)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import torch

    torch.manual_seed(0)
    records, tokenizer = load_dataset("reverse"), load_tokenizer("tiny")
    base = load_model("tiny")
    trained = load_model("tiny")
    load_weights(trained, STEP_1)
    backends = [TorchBackend(m, tokenizer.eos_token_id, tokenizer.pad_token_id) for m in (base, trained)]

    old_honest, old_best, new_honest, new_best, sequence, older = [], [], [], [], [], []
    for counter in range(1, args.batches + 1):
        labels = [reward(backends[1], tokenizer, records, old_plan(counter, s, len(records)))
                  for s in (1, 2, 3)]
        old_honest.append(labels[-1])
        old_best.append(max(labels))
        plan = plan_batch(NODE, counter, len(records), BATCH, N, [8], TASK)
        mine = [reward(b, tokenizer, records, plan) for b in backends]
        new_honest.append(mine[1])
        new_best.append(max(mine))
        sequence.append(mine[1])
        older.append(mine[0])
        print(f"batch {counter}: old labels {[round(x, 3) for x in labels]}, new checkpoints "
              f"{[round(x, 3) for x in mine]}", file=sys.stderr, flush=True)

    shifted = [x + statistics.fmean(older) - statistics.fmean(sequence) for x in sequence]
    median = statistics.median(sequence)
    # cheat a, old rules: per step counters restart; the node stops a step before its first bad batch
    # and starts the next step afresh: every batch it submits is paid, none is bad.
    old_a = [x for x in sequence if x >= median]
    # new rules: the same made batches in counter order; the cheater withholds every bad one
    submitted = [c for c, x in enumerate(sequence, start=1) if x >= median]
    paid = paid_under_hold(submitted)
    new_a = [sequence[c - 1] for c in paid]
    figures = {
        "batches": args.batches, "hold": HOLD,
        "label_choice": {
            "old_gain": statistics.fmean(old_best) - statistics.fmean(old_honest),
            "new_gain": statistics.fmean(new_best) - statistics.fmean(new_honest),
            "old_honest_mean": statistics.fmean(old_honest), "new_honest_mean": statistics.fmean(new_honest),
            "under_the_rule": {str(b): label_cheats(older, sequence, b, tokenizer) for b in args.per_step},
            # The same batches with the newer checkpoint's rewards moved by the difference of the two
            # means: two checkpoints of equal quality and these batches' noise, where choosing is all
            # there is to gain (the tiny model's one step made it worse on this task, so above, a node
            # that stays a step behind gains without choosing anything).
            "equal_quality": {str(b): label_cheats(older, shifted, b, tokenizer) for b in args.per_step},
        },
        "stop_before_bad": {
            "made_mean": statistics.fmean(sequence), "made": len(sequence),
            "old_paid": len(old_a), "old_paid_mean": statistics.fmean(old_a),
            "new_submitted": len(submitted), "new_paid": len(paid),
            "new_paid_mean": statistics.fmean(new_a) if new_a else None,
            "honest_paid": len(sequence),
        },
    }
    if args.json:
        print(json.dumps(figures, indent=1))
        return 0
    lc, sb = figures["label_choice"], figures["stop_before_bad"]
    print(f"label choice (best of the window): task reward gain {lc['old_gain']:+.3f} before (3 plans), "
          f"{lc['new_gain']:+.3f} now if every choice were paid (2 checkpoints, one plan)")
    tables = [(per_step, table, "") for per_step, table in lc["under_the_rule"].items()]
    equal = ", checkpoints of equal quality"
    tables += [(per_step, table, equal) for per_step, table in lc["equal_quality"].items()]
    for per_step, table, what in tables:
        honest = table["honest"]
        print(f"  judged by the rule, a new checkpoint every {per_step} batches{what} (honest mean "
              f"{honest['mean_paid']:.3f}: the better of all older {honest['mean_older']:.3f} "
              f"and all newer {honest['mean_newer']:.3f}):")  # fmt: skip
        for name, row in table.items():
            if name != "honest":
                print(f"    {name:>22}: {row['paid']:>2} paid, mean {row['mean_paid']:.3f}; paid reward per "
                      f"batch made vs honest {row['gain_per_made_batch']:+.3f}")
    print(f"stop before a bad batch: made {sb['made']} (mean {sb['made_mean']:.3f}); "
          f"before: {sb['old_paid']} "
          f"paid, mean {sb['old_paid_mean']:.3f}; now: {sb['new_submitted']} submitted, {sb['new_paid']} "
          f"paid{'' if not new_a else f', mean {statistics.fmean(new_a):.3f}'} (an honest node: "
          f"{sb['honest_paid']} paid)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
