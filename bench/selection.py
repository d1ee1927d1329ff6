"""Selection among outcomes (issues 37.5 and 54): can a node choose which of the batches it made are
paid (and trained on)? Every sequence here is judged by the real judge: `InferenceJudge` of the inference
workload with the shipped tiny model, a fresh `MemorySeenStore` and `MemoryNodeWindows` per sequence,
and the trainer's checkpoints as a validator has them (`ModelCheckpoints("tiny")` plus the trainer's
checkpoint of the step the files are labelled with). Only files it accepts count as paid.

Each run is one node (its own address, so its own prompts and seeds): `--batches` real batches made
once with the inference workload (the demo's RL task: string reversal, 8 prompts x 4 completions, 16
new tokens, TOPLOC proofs), labelled step 2 and made with the trainer's checkpoint of step 2 (the
demo's one-step checkpoint, tests/workloads/judge/data/demo-near-tie/step_1.safetensors), submitted
while the trainer is at step 3 (window [1, 3], async level 2). The same files are reused by every
sequence of the run:

- honest: every batch, in counter order;
- honest, storage lost one: as honest, but one file (a counter drawn at random, whatever its reward)
  is never read by the validator (storage unreachable to its deadline): the next file comes with
  `Submission.counters_unknown` = 1. What the rule costs an honest node;
- the cheats: a batch whose task reward is below the run's median (the cheater knows every reward:
  its best case), and that would be paid if submitted as made (the cheater runs the public rule on
  its own history, `counter_order` on a copy of the validator's window: it never drops a batch that
  is held anyway), is kept from being paid by
  - withhold: not submitted;
  - burn: submitted, never readable (bigger than the validator's size limit, which the pool's storage
    may allow): now a verdict of its own ("size:", validator/judging.py), so the next file is a gap;
    before issue 54 the validator took it for unreachable storage (the next file came with
    `counters_unknown` = 1: a skip, unheld);
  - relabel, stale step: submitted labelled step 0, behind the trainer's window;
  - relabel, checkpoint gone: submitted naming the checkpoint of step 1, which the trainer no longer
    has (in the window, so not a slash);
  - reorder: submitted after the next batch (the two swapped).

Figures per sequence, mean ± sd over the runs: the share of the batches made that are paid, the mean
task reward of the paid batches against that of everything made (what the trainer is fed against
what the node made: the selection's bias), and the cheater's paid reward per batch made against the
honest node's (its gain in pay). `--before` judges the same sequences again under the rule before
issue 54 (workloads/inference/judge/checks/history.py at commit BEFORE, read with git: no forfeit).

    .venv/bin/python bench/selection.py [--runs 3] [--batches 24] [--before] [--json]

Writes bench/out/selection.json. No timing is asserted.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from intellect.wire.verdicts import Submission  # noqa: E402
from intellect.workloads import MemoryNodeWindows, MemorySeenStore  # noqa: E402
from workloads.inference.judge import file_judge as judge_pipeline  # noqa: E402
from workloads.inference.judge.checks import history  # noqa: E402
from workloads.inference.judge.checks.context import FileContext  # noqa: E402
from workloads.inference.judge.file_judge import InferenceJudge  # noqa: E402
from workloads.inference.settings import InferenceSettings  # noqa: E402
from workloads.inference.task import TaskSettings  # noqa: E402
from workloads.inference.workload import InferenceWorkload  # noqa: E402
from workloads.model.loading import ModelCheckpoints, base_checkpoint_sha256  # noqa: E402
from workloads.rollouts import BatchInfo, read_rollouts, write_rollouts  # noqa: E402

TASK = TaskSettings(dataset="reverse", batch_size=8, n=4, max_new_tokens=16, target_lengths=[8])
STEP_FILE = REPO / "tests" / "workloads" / "judge" / "data" / "demo-near-tie" / "step_1.safetensors"
LABEL, TRAINER_AT, GONE = 2, 3, 1  # files' step and checkpoint; the trainer's step; a checkpoint it lost
POOL = 1
BEFORE = "0fd3285"  # the last commit before issue 54's forfeit and unread holds
OUT = REPO / "bench" / "out" / "selection.json"
HONEST, LOST = "honest", "honest, storage lost one"
CHEATS = ("withhold", "burn", "relabel: stale step", "relabel: checkpoint gone", "reorder")
SEQUENCES = (HONEST, LOST, *CHEATS)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Trainer:
    """The trainer at step TRAINER_AT as a validator can have it: the checkpoint of step LABEL; not
    GONE's (it keeps few files)."""

    def __init__(self, path: Path) -> None:
        self.path, self.sha = path, sha256_of(path)

    def checkpoint_for(self, step: int) -> tuple[Path, str] | None:
        return (self.path, self.sha) if step == LABEL else None


@dataclass
class Made:
    path: Path
    info: BatchInfo
    reward: float  # the batch's mean task reward
    stale: Path | None = None
    gone: Path | None = None


def relabel(src: Path, dst: Path, **update: Any) -> Path:
    """The header a node likes on the batch it made (rows name their step too)."""
    rows, info = read_rollouts(src)
    if "step" in update:
        rows = [r.model_copy(update={"step": update["step"]}) for r in rows]
    write_rollouts(dst, rows, info.model_copy(update=update))
    return dst


def make_files(out: Path, node: str, count: int, checkpoints: Path, base_sha: str) -> list[Made]:
    """A node's batches 1..count, made by the inference workload, and the relabelled copies."""
    workload = InferenceWorkload(InferenceSettings(
        node_address=node, output_dir=out, step=LABEL, async_level=TASK.async_level,
        checkpoint_source=str(checkpoints / "step_{step}.safetensors"), checkpoint_cache=out / ".checkpoints",
        dataset=TASK.dataset, batch_size=TASK.batch_size, n=TASK.n, max_new_tokens=TASK.max_new_tokens,
        target_lengths=TASK.target_lengths, length_penalty=TASK.length_penalty,
    ))  # fmt: skip
    made = []
    for _ in range(count):
        report = workload.run_batch()
        assert report is not None and report.checkpoint_step == LABEL, report
        path = Path(report.path)
        info = read_rollouts(path)[1]
        stale = relabel(path, out / f"stale-{info.batch_counter}.parquet", step=0, checkpoint_step=0,
                        checkpoint_sha256=base_sha)  # the base model's: a step-0 label names it
        gone = relabel(path, out / f"gone-{info.batch_counter}.parquet", checkpoint_step=GONE)
        made.append(Made(path, info, report.task_reward_mean, stale, gone))
    return made


def rule_before() -> types.ModuleType:
    """history.py as it was before issue 54 (read from git at BEFORE)."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{BEFORE}:workloads/inference/judge/checks/history.py"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    module = types.ModuleType("history_before")
    exec(compile(source, f"{BEFORE}:history.py", "exec"), module.__dict__)  # noqa: S102
    return module


@contextmanager
def judged_by(rule: types.ModuleType) -> Iterator[None]:
    """The pipeline with `rule`'s counter_order (and no forfeit where `rule` has none)."""
    saved = judge_pipeline.counter_order, judge_pipeline.forfeit
    judge_pipeline.counter_order = rule.counter_order
    judge_pipeline.forfeit = getattr(rule, "forfeit", lambda ctx, windows, reasons: None)
    try:
        yield
    finally:
        judge_pipeline.counter_order, judge_pipeline.forfeit = saved


def play(sequence: str, made: list[Made], node: str, pipeline: InferenceJudge, rule: types.ModuleType,
         bad: set[int], lost: int) -> tuple[list[int], int, int]:  # fmt: skip
    """Submit `made` as `sequence` does to one validator: the counters paid, the files submitted and
    the files invalidated (a slash: none is expected, every cheat here is built to stay soft)."""
    paid: list[int] = []
    unread, submitted, slashed = 0, 0, 0

    def submission() -> Submission:
        return Submission(node=node, pool_id=POOL, trainer_step=TRAINER_AT, counters_unknown=unread)

    def submit(m: Made, path: Path | None = None) -> None:
        nonlocal unread, submitted, slashed
        verdict = pipeline.judge(path or m.path, submission())
        unread, submitted = 0, submitted + 1
        if verdict.verdict == "accept":
            paid.append(m.info.batch_counter)
        slashed += verdict.verdict == "invalidate"

    def would_be_paid(m: Made) -> bool:
        """The node runs the public rule on its own history (a copy of the validator's window)."""
        ctx = FileContext(path=m.path, submission=submission(), task=TASK, thresholds=pipeline.thresholds,
                          records=[], tokenizer=pipeline.tokenizer, seen=MemorySeenStore(),
                          checkpoints=pipeline.checkpoints, vocab_size=0, info=m.info,
                          sha256=f"peek-{m.info.batch_counter}")  # fmt: skip
        return not rule.counter_order(ctx, copy.deepcopy(pipeline.windows))

    i = 0
    while i < len(made):
        m = made[i]
        if sequence == LOST and m.info.batch_counter == lost:
            unread, submitted = min(unread + 1, 4), submitted + 1  # submitted, never read
        elif sequence in (HONEST, LOST) or m.info.batch_counter not in bad or not would_be_paid(m):
            submit(m)
        elif sequence == "burn":  # too big to read: now a "size:" verdict of its own, no unread file;
            # before issue 54 the validator took it for storage it could not reach (unread: a skip)
            before = not hasattr(rule, "forfeit")
            unread, submitted = (min(unread + 1, 4) if before else unread), submitted + 1
        elif sequence == "relabel: stale step":
            submit(m, m.stale)
        elif sequence == "relabel: checkpoint gone":
            submit(m, m.gone)
        elif sequence == "reorder" and i + 1 < len(made):
            submit(made[i + 1])
            submit(m)
            i += 1
        # withhold (and reorder's last batch): not submitted
        i += 1
    return paid, submitted, slashed


def one_run(run: int, seed: int, count: int, rules: dict[str, types.ModuleType], work: Path,
            checkpoints: Path, log: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    base_sha = base_checkpoint_sha256(TASK.model)
    assert base_sha is not None
    node = "0x" + hashlib.sha256(f"bench-selection-{seed}-{run}".encode()).hexdigest()[:40]
    started = time.perf_counter()
    made = make_files(work / f"run-{run}", node, count, checkpoints, base_sha)
    log(f"run {run}: node {node}, {count} batches made in {time.perf_counter() - started:.0f} s")
    rewards = {m.info.batch_counter: m.reward for m in made}
    median = statistics.median(rewards.values())
    bad = {c for c, r in rewards.items() if r < median}
    lost = random.Random(f"{seed}-{run}").randint(2, max(2, count - history.HOLD - 1))
    trainer = Trainer(checkpoints / f"step_{LABEL}.safetensors")
    out: dict[str, Any] = {"node": node, "made_mean": statistics.fmean(rewards.values()), "rewards": rewards,
                           "bad": sorted(bad), "lost": lost, "rules": {}}  # fmt: skip
    for name, rule in rules.items():
        table: dict[str, Any] = {}
        with judged_by(rule):
            for sequence in SEQUENCES:
                t0 = time.perf_counter()
                pipeline = InferenceJudge(TASK, MemorySeenStore(), ModelCheckpoints(TASK.model, host=trainer),
                                    windows=MemoryNodeWindows())  # fmt: skip
                paid, submitted, slashed = play(sequence, made, node, pipeline, rule, bad, lost)
                got = [rewards[c] for c in paid]
                table[sequence] = {
                    "submitted": submitted, "slashed": slashed, "paid": len(paid), "paid_counters": paid,
                    "share_paid": len(paid) / count,
                    "paid_mean": statistics.fmean(got) if got else None,
                    "paid_reward_per_made": sum(got) / count,
                }  # fmt: skip
                log(f"run {run} [{name}] {sequence}: {submitted} submitted, {len(paid)} paid, {slashed} "
                    f"slashed ({time.perf_counter() - t0:.0f} s)")  # fmt: skip
        honest = table[HONEST]["paid_reward_per_made"]
        for row in table.values():
            row["gain_vs_honest"] = row["paid_reward_per_made"] - honest
            row["bias"] = None if row["paid_mean"] is None else row["paid_mean"] - out["made_mean"]
        out["rules"][name] = table
    return out


def spread(values: list[float]) -> dict[str, float | int]:
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values)}  # fmt: skip


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {"made_mean": spread([r["made_mean"] for r in runs])}
    for name in runs[0]["rules"]:
        rows = {}
        for sequence in SEQUENCES:
            each = [r["rules"][name][sequence] for r in runs]
            rows[sequence] = {
                "submitted": spread([e["submitted"] for e in each]),
                "share_paid": spread([e["share_paid"] for e in each]),
                "paid_mean": spread([e["paid_mean"] for e in each if e["paid_mean"] is not None] or [0.0]),
                "bias": spread([e["bias"] for e in each if e["bias"] is not None] or [0.0]),
                "gain_vs_honest": spread([e["gain_vs_honest"] for e in each]),
                "runs_with_nothing_paid": sum(e["paid_mean"] is None for e in each),
                "slashed": sum(e["slashed"] for e in each),
            }  # fmt: skip
        summary[name] = rows
    return summary


def pm(s: dict[str, float | int], digits: int = 3, percent: bool = False) -> str:
    if percent:
        return f"{100 * s['mean']:.0f} ± {100 * s['sd']:.0f} %"
    return f"{s['mean']:+.{digits}f} ± {s['sd']:.{digits}f}" if digits else f"{s['mean']:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="nodes (each its own batches)")
    parser.add_argument("--batches", type=int, default=24, help="batches each node makes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--before", action="store_true", help=f"also judge under the rule of {BEFORE}")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.batches < history.HOLD + 4:
        parser.error(f"--batches must be at least {history.HOLD + 4} (a hold is {history.HOLD})")
    import torch

    torch.manual_seed(args.seed)
    rules = {"now": history, **({"before": rule_before()} if args.before else {})}
    started = time.perf_counter()

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-selection-") as tmp:
        work = Path(tmp)
        checkpoints = work / "trainer"
        checkpoints.mkdir()
        shutil.copyfile(STEP_FILE, checkpoints / f"step_{LABEL}.safetensors")
        (checkpoints / f"step_{LABEL}.safetensors.sha256").write_text(sha256_of(STEP_FILE))
        runs = [one_run(r, args.seed, args.batches, rules, work, checkpoints, log) for r in range(args.runs)]
    figures = {
        "command": "bench/selection.py " + " ".join(sys.argv[1:]),
        "runs": args.runs, "batches": args.batches, "seed": args.seed, "hold": history.HOLD,
        "task": TASK.model_dump(), "seconds": round(time.perf_counter() - started, 1),
        "summary": summarise(runs), "per_run": runs,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=1))
    if args.json:
        print(json.dumps(figures, indent=1))
        return 0
    s = figures["summary"]
    print(f"{args.runs} runs x {args.batches} batches (HOLD {history.HOLD}); task reward of everything made "
          f"{s['made_mean']['mean']:.3f} ± {s['made_mean']['sd']:.3f}; {figures['seconds']:.0f} s")
    for name in rules:
        print(f"\nrule {name}:")
        print(f"  {'sequence':<26} {'submitted':>9}  {'paid':>11}  {'paid mean':>13}  {'paid − made':>14}  "
              f"{'paid/made vs honest':>19}")  # fmt: skip
        for sequence, row in s[name].items():
            none = row["runs_with_nothing_paid"]
            nothing = f" ({none} of {args.runs} runs: none paid)" if none else ""
            nothing += f" ({row['slashed']} files slashed)" if row["slashed"] else ""
            paid = pm(row["share_paid"], percent=True)
            mean = f"{row['paid_mean']['mean']:.3f} ± {row['paid_mean']['sd']:.3f}"
            bias, gain = pm(row["bias"]), pm(row["gain_vs_honest"])
            print(f"  {sequence:<26} {pm(row['submitted'], 0):>9}  {paid:>11}  {mean:>13}  {bias:>14}  "
                  f"{gain:>19}{nothing}")  # fmt: skip
    print("\npaid mean: the mean task reward of the batches paid (runs where any was); paid − made: that "
          "against the mean of everything the node made (the selection's bias: what the trainer is fed "
          "against what was made); paid/made vs honest: paid task reward per batch made, against the "
          "honest node's")  # fmt: skip
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
