"""The pooled per-stage check, calibrated: honest groups never blamed nor left unpaid, perturbed-weights
members always blamed (exactly them) at every stage position, over windows of a member's files of one
shape.

Runs 2- and 3-member groups of the shipped tiny model (real member processes on loopback): honest
groups over files of every shape (1 to 64 rows, 1 to 96 tokens; tiny files on purpose, since a task
has one batch size and a window may be made of 1-row files only), and a member with perturbed
weights (`weights` cheat: N(0, 1e-2) on one matrix of its layers) at stage 0 of 2, last of 2, stage 0
of 3, middle of 3 and last of 3. Every batch is judged with `judge_group` (the end-to-end figures,
what `pooled_blame` judges for pay) and every member with `judge_member` (its own stage against the
replay of what it received, what `pooled_own` judges for blame); then each sequence of files of one
shape (and the whole mixed sequence) is fed, in order, to the windows exactly as `PipelineJudge`
feeds them (accepted batches only, `POOL_FILES` kept) and both rules are applied at every file.
Prints and writes (bench/out/pipeline_pooled.json, or `--out`) the honest rows, the worst honest pooled
mean per stage position (end to end and own; overall and per shape), the weakest cheater's pooled
mean at its own stage (both figures), who was blamed and after how many files.

The default is the original calibration's shapes (dataset `demo`, one completion a prompt, the base
model). What an RL run's group does is chosen with the options: `--dataset reverse --n 4` (the devnet's
pipeline task: `devnet/demo.py` `pipeline_task_spec`, 16 prompts × 4 completions = 64 rows, up to 16
new tokens, each row stopping at its end-of-sequence token), `--in-flight 4` (the devnet over delayed
links: the same figures as 1), `--weights` a trainer checkpoint (`step_N.safetensors`) that the members
load as their policy, as `Policies.stage` does, and the judge loads as the validator does, or
`synthetic:STEPS` for one trained here on synthetic rollouts. `--shape ROWSxTOKENS:FILES` replaces the
default shapes, `--cheat-shape` the cheaters' (default `--shape`), `--positions` the cheaters' stage
positions (members:stage, or none). The runs behind `TINY_POOLED` (judge/pooled.py), 5 and 9 minutes
each on this 2-core machine under load:

    .venv/bin/python bench/pipeline_pooled.py
    .venv/bin/python bench/pipeline_pooled.py --dataset reverse --n 4 --shape 64x16:8 --shape 16x16:16 \\
        --cheat-shape 64x16:3 --cheat-shape 16x16:6 --out pipeline_pooled_rl.json  # + --weights ...
    .venv/bin/python bench/pipeline_pooled.py --from bench/out/pipeline_pooled_batches.json  # re-judge
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workloads.pipeline.judge.end_to_end import StageStats  # noqa: E402
from workloads.pipeline.judge.pooled import (  # noqa: E402, E501
    POOL_FILES,
    TINY_POOLED,
    excess,
    pool,
    pool_own,
    pooled_blame,
    pooled_mean,
    pooled_own,
    window_entry,
)

OUT = ROOT / "bench" / "out"
# (rows, max new tokens, files) per group size; the header of a ring frame (64 KiB) bounds rows × tokens
HONEST = {
    2: [(1, 1, 20), (1, 4, 20), (1, 96, 20), (8, 8, 12), (8, 96, 12), (32, 8, 8), (64, 1, 8)],
    3: [(1, 1, 20), (1, 4, 20), (1, 96, 20), (4, 96, 12), (8, 8, 12), (8, 32, 12), (16, 8, 10), (32, 1, 20)],
}
CHEAT = {
    2: [(1, 4, 20), (1, 96, 20), (8, 8, 8), (8, 96, 4), (32, 8, 4)],
    3: [(1, 4, 20), (1, 96, 20), (8, 8, 8), (8, 32, 4), (16, 8, 4)],
}
POSITIONS = [(2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]  # (members, perturbed stage)


@dataclass(frozen=True)
class Setup:
    """What the groups run besides their shapes: the prompts' dataset, completions a prompt (rows are
    prompt-major, each its own seed, as `files.plan_group_batch` lays a task's batch out), the policy's
    weights (None: the base model), batches in flight at once."""

    dataset: str = "demo"
    n: int = 1
    weights: str | None = None
    in_flight: int = 1


def generate(members: int, cheat_stage: int, plan: list[tuple[int, int, int]],
             setup: Setup = Setup()) -> list[dict[str, Any]]:  # fmt: skip
    """Run the group over `plan` and judge each batch: per batch its shape, the group verdict with every
    stage's end-to-end figures, and each member's own figures (None where its replay proves nothing)."""
    from workloads.datasets import load_dataset
    from workloads.model.loading import load_model, load_tokenizer, load_weights
    from workloads.pipeline.group import run_local_group
    from workloads.pipeline.judge.end_to_end import GroupRows, judge_group
    from workloads.pipeline.judge.replay import judge_member
    from workloads.pipeline.member import BatchRequest
    from workloads.pipeline.stages import plan_stages

    tok, model, records = load_tokenizer("tiny"), load_model("tiny"), load_dataset(setup.dataset)
    if setup.weights:
        load_weights(model, setup.weights)
    seed = 7_000_000 + members * 100_000 + (cheat_stage + 1) * 10_000
    requests, shapes = [], []
    for rows, max_new, files in plan:
        for _ in range(files):
            prompts_n = max(1, rows // setup.n)
            idx = [(seed + 13 * i) % len(records) for i in range(prompts_n)]
            prompts = [tok(records[i].prompt)["input_ids"] for i in idx for _ in range(setup.n)][:rows]
            prompts += prompts[: rows - len(prompts)]
            requests.append(BatchRequest(prompts, [seed + i for i in range(rows)], max_new, 1.0))
            shapes.append(f"{rows}x{max_new}")
            seed += rows
    with tempfile.TemporaryDirectory() as folder:
        cheats = {cheat_stage: "weights"} if cheat_stage >= 0 else None
        run = run_local_group(members, requests, Path(folder), cheats=cheats, timeout=120,
                              weights=Path(setup.weights) if setup.weights else None,
                              in_flight=setup.in_flight)  # fmt: skip
    if run.errors:
        raise SystemExit(f"a group failed: {run.errors}")
    plans, out = plan_stages("tiny", members), []
    eos, pad = int(tok.eos_token_id), int(tok.pad_token_id)
    for shape, req, outputs in zip(shapes, requests, run.batches, strict=True):
        rows_ = GroupRows(req.prompts, outputs[0].tokens, outputs[members - 1].logprobs, req.seeds,
                          [outputs[i].proofs for i in range(members)])  # fmt: skip
        verdict = judge_group(model, plans, rows_, pad)
        own: list[list[float] | None] = []
        guilty = []
        for k in range(members):
            o = outputs[k]
            local = judge_member(model, plans, k, o.bundle, o.received_frames, o.sent_frames, task_id="local",
                                 group_id="local", batch=o.batch, eos=eos, pad=pad)  # fmt: skip
            own.append([local.stats.chunks, round(local.stats.mant_sum, 6)] if local.proven else None)
            if local.guilty:
                guilty.append(k)
        out.append({"shape": shape, "rows": len(req.prompts), "accepted": verdict.accepted,
                    "blamed": verdict.blamed, "stats": [asdict(s) for s in verdict.stage_stats],
                    "own": own, "guilty": guilty})  # fmt: skip
    return out


def _entry(n: int, batch: dict[str, Any], stage: int) -> dict[str, Any]:
    """Member `stage`'s window entry of a judged batch, as `PipelineJudge._pooled_verdict` makes it."""
    own = (batch.get("own") or [None] * len(batch["stats"]))[stage]
    return window_entry("g", stage, str(n), [StageStats(**s) for s in batch["stats"]],
                        StageStats(int(own[0]), float(own[1])) if own else None)  # fmt: skip


def file_guilty(batch: dict[str, Any]) -> list[int]:
    """The members the file rules find guilty (`judge_member`, what the validator slashes on); batches of
    an earlier run that did not record it: the stage the group verdict pointed at."""
    if "guilty" in batch:
        return list(batch["guilty"])
    return [batch["blamed"]] if not batch["accepted"] and batch["blamed"] is not None else []


def replay_windows(batches: list[dict[str, Any]], members: int) -> dict[str, Any]:
    """Feed one group's files in order to each member's window as the judge does; per file the verdicts.
    `blamed`: the members blamed (by the file rules, or by `pooled_own` over their windows), `unpaid`:
    the batch's honest members are not paid (it failed end to end, or `pooled_blame` is out: that rule
    blames nobody, the batch is only not paid)."""
    windows: list[list[dict[str, Any]]] = [[] for _ in range(members)]
    group: list[dict[str, Any]] = []  # every accepted batch: the end-to-end figures pooled for pay
    blamed: list[list[int]] = []
    unpaid: list[bool] = []
    worst: dict[int, float] = {}  # stage → highest end-to-end pooled mean judged (≥ min_chunks)
    own_worst: dict[int, float] = {}  # stage → highest own pooled mean judged
    for n, batch in enumerate(batches):
        if not batch["accepted"]:
            blamed.append(file_guilty(batch))  # judged chunk by chunk; not fed to the windows
            unpaid.append(True)
            continue
        guilty = file_guilty(batch)
        for k in range(members):
            if k in guilty:  # its file `invalidate` before its window is fed
                continue
            windows[k] = [*windows[k], _entry(n, batch, k)][-POOL_FILES:]
            mine, files = pool_own(windows[k], "g", k)
            if files and mine.chunks >= TINY_POOLED.min_chunks:
                own_worst[k] = max(own_worst.get(k, 0.0), pooled_mean(mine))
            if files and pooled_own(mine, k, k == members - 1, files).out and k not in guilty:
                guilty.append(k)
        group = [*group, _entry(n, batch, 0)][-POOL_FILES:]
        pooled, files = pool(group, "g", 0)
        for k, s in enumerate(pooled):
            if s.chunks >= TINY_POOLED.pay_chunks:
                worst[k] = max(worst.get(k, 0.0), pooled_mean(s))
        blamed.append(sorted(guilty))
        unpaid.append(pooled_blame(pooled, files).out)
    return {"blamed": blamed, "unpaid": unpaid, "pooled_max": worst, "own_max": own_worst}


def judged_sequences(batches: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each shape's files on their own (a task's window), and all of them in generated order."""
    by_shape: dict[str, list[dict[str, Any]]] = {}
    for b in batches:
        by_shape.setdefault(b["shape"], []).append(b)
    return {**by_shape, "mixed": batches} if len(by_shape) > 1 else by_shape


def lowest_pooled(batches: list[dict[str, Any]], stage: int, own: bool = False) -> float | None:
    """The cheater's smallest pooled mean at its own stage over any judged window of its files: end to
    end, or (`own`) its own figures against the replay of what it received."""
    window: list[dict[str, Any]] = []
    low: float | None = None
    for n, batch in enumerate(batches):
        if not batch["accepted"] or (own and not (batch.get("own") or [None] * (stage + 1))[stage]):
            continue
        window = [*window, _entry(n, batch, stage)][-POOL_FILES:]
        if own:
            stats, _ = pool_own(window, "g", stage)
        else:
            stats = pool(window, "g", stage)[0][stage]
        if stats.chunks >= (TINY_POOLED.min_chunks if own else TINY_POOLED.pay_chunks):
            value = pooled_mean(stats)
            low = value if low is None else min(low, value)
    return low


def amplification(batches: list[dict[str, Any]], stage: int, members: int) -> float | None:
    """How much of the cheater's excess (pooled mean over its position's honest base, over all its
    accepted files) a later stage shows, at most: what `TINY_POOLED.amplification` must exceed."""
    entries = [window_entry("g", 0, str(n), [StageStats(**s) for s in b["stats"]])
               for n, b in enumerate(batches) if b["accepted"]]  # fmt: skip
    if not entries:
        return None
    pooled, _ = pool(entries, "g", 0)

    def base(k: int) -> float:
        return TINY_POOLED.base_last if k == members - 1 else TINY_POOLED.base_inner

    own = excess(pooled[stage], base(stage))
    later = [excess(pooled[k], base(k)) / own for k in range(stage + 1, members)
             if own > 0 and pooled[k].chunks >= TINY_POOLED.min_chunks]  # fmt: skip
    return round(max(later), 2) if later else None


def _first(flags: list[bool]) -> int | None:
    return next((i + 1 for i, f in enumerate(flags) if f), None)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def analyse(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    honest: dict[str, Any] = {"rows": 0, "files": 0, "sequences": 0, "files_blamed": 0, "files_unpaid": 0,
                              "worst": {}, "own_worst": {}, "by_shape": {}}  # fmt: skip
    cheats: list[dict[str, Any]] = []
    for key, batches in runs.items():
        members, stage = (int(x) for x in key.split(":"))
        last = members - 1
        for name, seq in judged_sequences(batches).items():
            got = replay_windows(seq, members)
            if stage < 0:
                honest["files"] += len(seq) if name != "mixed" else 0
                honest["rows"] += sum(b["rows"] for b in seq) if name != "mixed" else 0
                honest["sequences"] += 1
                honest["files_blamed"] += sum(bool(b) for b in got["blamed"])
                honest["files_unpaid"] += sum(got["unpaid"])
                shape = honest["by_shape"].setdefault(name, {})
                for field, figures in (("worst", got["pooled_max"]), ("own_worst", got["own_max"])):
                    for k, v in figures.items():
                        where = f"{members}:{'last' if k == last else k}"
                        honest[field][where] = round(max(honest[field].get(where, 0.0), v), 4)
                        mark = where if field == "worst" else f"{where} own"
                        shape[mark] = round(max(shape.get(mark, 0.0), v), 4)
                continue
            first = _first([stage in b for b in got["blamed"]])
            wrong = sorted({k for b in got["blamed"] for k in b if k != stage})
            cheats.append({"members": members, "stage": stage, "shape": name, "files": len(seq),
                           "chunk_blamed_files": sum(stage in file_guilty(b) for b in seq),
                           "blamed_after_files": first, "unpaid_files": sum(got["unpaid"]),
                           "others_blamed": wrong, "weakest_pooled": _rounded(lowest_pooled(seq, stage)),
                           "weakest_own": _rounded(lowest_pooled(seq, stage, own=True)),
                           "amplification": amplification(seq, stage, members),
                           "caught": first is not None and not wrong})  # fmt: skip
    return {"limits": asdict(TINY_POOLED), "pool_files": POOL_FILES, "honest": honest, "cheats": cheats}


def _shape(text: str) -> tuple[int, int, int]:
    """ROWSxTOKENS:FILES, e.g. 64x16:6."""
    size, _, files = text.partition(":")
    rows, _, tokens = size.partition("x")
    return int(rows), int(tokens), int(files or 4)


def synthetic_checkpoint(steps: int, folder: Path) -> Path:
    """A policy `steps` GRPO steps away from the base model: `intellect-train --cpu-demo` over synthetic
    rollout files (random tokens, mixed rewards: tests/support/rollout_files.py, as bench/trainer_ranks.py
    runs it). Random-token rollouts pull the policy far from the base (KL 12-44 to it from step 13 on, a
    real run's is 0.17 at step 4): the drifted end of what a group following a trainer may be handed."""
    import os
    import subprocess

    from tests.support.rollout_files import write_files

    for step in range(steps):
        write_files(folder / "rollouts", 9, seed=100 + step, step=step)
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_")}
    env |= {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    command = [sys.executable, "-m", "workloads.trainer", "--cpu-demo", "--model", "tiny", "--rollouts",
               str(folder / "rollouts"), "--output-dir", str(folder / "ck"), "--max-steps", str(steps),
               "--rows-per-step", "256", "--vote-window-seconds", "0", "--port", "0", "--poll-seconds", "0.1",
               "--nproc", "1"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return folder / "ck" / f"step_{steps}.safetensors"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", type=Path, help="judged batches of an earlier run")
    parser.add_argument("--dataset", default="demo", help="the prompts' dataset (the devnet's: reverse)")
    parser.add_argument("--n", type=int, default=1, help="completions per prompt (the devnet's: 4)")
    parser.add_argument("--weights", help="a trainer checkpoint (safetensors) the members and the judge "
                        "load, or synthetic:STEPS (one made here, `synthetic_checkpoint`)")  # fmt: skip
    parser.add_argument("--in-flight", type=int, default=1, help="batches moving at once (delayed links: 4)")
    parser.add_argument("--shape", action="append", type=_shape, help="ROWSxTOKENS:FILES (repeatable)")
    parser.add_argument("--cheat-shape", action="append", type=_shape, help="the cheaters' (default --shape)")
    parser.add_argument("--members", type=int, nargs="*", default=[2, 3], help="honest group sizes (none: "
                        "cheaters only)")  # fmt: skip
    parser.add_argument("--positions", nargs="*", help="cheaters as MEMBERS:STAGE (none: honest only)")
    parser.add_argument("--out", default="pipeline_pooled.json", help="file under bench/out")
    args = parser.parse_args()
    torch.set_num_threads(2)
    started = time.perf_counter()
    positions = POSITIONS if args.positions is None else [
        (int(p.split(":")[0]), int(p.split(":")[1])) for p in args.positions if p != "none"]  # fmt: skip
    batches_file = OUT / args.out.replace(".json", "_batches.json")
    setup = Setup(args.dataset, args.n, args.weights, args.in_flight)
    if args.source:
        runs = json.loads(args.source.read_text())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            weights = args.weights
            if weights and weights.startswith("synthetic:"):
                weights = str(synthetic_checkpoint(int(weights.removeprefix("synthetic:")), Path(tmp)))
                print(f"{args.weights}: {time.perf_counter() - started:.0f} s", flush=True)
            made = Setup(args.dataset, args.n, weights, args.in_flight)
            runs = {}
            for members in args.members:
                runs[f"{members}:-1"] = generate(members, -1, args.shape or HONEST[members], made)
                print(f"honest {members} members: {time.perf_counter() - started:.0f} s", flush=True)
            for members, stage in positions:
                plan = args.cheat_shape or args.shape or CHEAT[members]
                runs[f"{members}:{stage}"] = generate(members, stage, plan, made)
                print(f"weights at stage {stage} of {members}: {time.perf_counter() - started:.0f} s",
                      flush=True)  # fmt: skip
        OUT.mkdir(exist_ok=True)
        made_in = round(time.perf_counter() - started, 1)
        batches_file.write_text(json.dumps({"setup": asdict(setup), "seconds": made_in, **runs}))
    setup_text, seconds = runs.pop("setup", None), runs.pop("seconds", None)
    result = analyse(runs)
    result["setup"] = setup_text or asdict(setup)
    result["seconds"] = seconds  # the runs' (member processes and judging), not this re-judging's
    (OUT / args.out).write_text(json.dumps(result, indent=1))
    h = result["honest"]
    print(f"limits: {result['limits']}, window: {POOL_FILES} files; setup: {result['setup']}")
    print(f"honest: {h['rows']} rows in {h['files']} files, {h['sequences']} windows replayed, "
          f"{h['files_blamed']} files with a member blamed, {h['files_unpaid']} not paid")  # fmt: skip
    print("worst honest pooled mean, end to end (members:stage):", h["worst"])
    print("worst honest pooled mean, own stage (members:stage):", h["own_worst"])
    for shape, worst in h["by_shape"].items():
        print(f"  {shape}: {worst}")
    print(f"{'members':>7s} {'stage':>5s} {'shape':>6s} {'files':>5s} {'file-blamed':>11s} "
          f"{'blamed after':>12s} {'weakest e2e':>11s} {'weakest own':>11s} caught unpaid amp")  # fmt: skip
    for c in result["cheats"]:
        print(f"{c['members']:>7d} {c['stage']:>5d} {c['shape']:>6s} {c['files']:>5d} "
              f"{c['chunk_blamed_files']:>11d} {c['blamed_after_files']!s:>12s} "
              f"{c['weakest_pooled']!s:>11s} {c['weakest_own']!s:>11s} {c['caught']!s:>6s} "
              f"{c['unpaid_files']:>3d}/{c['files']:<3d} {c['amplification']}")  # fmt: skip
    caught = sum(c["caught"] for c in result["cheats"])
    print(f"cheat sequences caught (exactly the cheater): {caught}/{len(result['cheats'])}; "
          f"{result['seconds']} s")  # fmt: skip


if __name__ == "__main__":
    main()
