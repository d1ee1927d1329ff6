"""The pooled per-stage check, calibrated: honest groups never blamed, perturbed-weights members always
blamed (exactly them) at every stage position, over windows of a member's files of one shape.

Runs 2- and 3-member groups of the shipped tiny model (real member processes on loopback): honest
groups over files of every shape (1 to 64 rows, 1 to 96 tokens; tiny files on purpose, since a task
has one batch size and a window may be made of 1-row files only), and a member with perturbed
weights (`weights` cheat: N(0, 1e-2) on one matrix of its layers) at stage 0 of 2, last of 2, stage 0
of 3, middle of 3 and last of 3. Every batch is judged with `judge_group`; then each sequence of
files of one shape (and the whole mixed sequence) is fed, in order, to the windows exactly as
`PipelineJudge` feeds them (accepted batches only, `POOL_FILES` kept) and `pooled_blame` is applied
at every file. Prints and writes (bench/out/pipeline_pooled.json) the honest rows, the worst honest
pooled mean per stage position, the weakest cheater's pooled mean at its own stage, who was blamed
and after how many files.

    .venv/bin/python bench/pipeline_pooled.py                 # ≈ 15 min on 2 cores
    .venv/bin/python bench/pipeline_pooled.py --from bench/out/pipeline_pooled_batches.json  # re-judge
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
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
    pooled_blame,
    pooled_mean,
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


def generate(members: int, cheat_stage: int, plan: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
    """Run the group over `plan` and judge each batch: per batch its shape and the group verdict."""
    from workloads.datasets import load_dataset
    from workloads.model.loading import load_model, load_tokenizer
    from workloads.pipeline.group import run_local_group
    from workloads.pipeline.judge.end_to_end import GroupRows, judge_group
    from workloads.pipeline.member import BatchRequest
    from workloads.pipeline.stages import plan_stages

    tok, model, records = load_tokenizer("tiny"), load_model("tiny"), load_dataset("demo")
    seed = 7_000_000 + members * 100_000 + (cheat_stage + 1) * 10_000
    requests, shapes = [], []
    for rows, max_new, files in plan:
        for _ in range(files):
            idx = [(seed + 13 * i) % len(records) for i in range(rows)]
            prompts = [tok(records[i].prompt)["input_ids"] for i in idx]
            requests.append(BatchRequest(prompts, [seed + i for i in range(rows)], max_new, 1.0))
            shapes.append(f"{rows}x{max_new}")
            seed += rows
    with tempfile.TemporaryDirectory() as folder:
        cheats = {cheat_stage: "weights"} if cheat_stage >= 0 else None
        run = run_local_group(members, requests, Path(folder), cheats=cheats, timeout=60)
    if run.errors:
        raise SystemExit(f"a group failed: {run.errors}")
    plans, out = plan_stages("tiny", members), []
    for shape, req, outputs in zip(shapes, requests, run.batches, strict=True):
        rows_ = GroupRows(req.prompts, outputs[0].tokens, outputs[members - 1].logprobs, req.seeds,
                          [outputs[i].proofs for i in range(members)])  # fmt: skip
        verdict = judge_group(model, plans, rows_, int(tok.pad_token_id))
        out.append({"shape": shape, "rows": len(req.prompts), "accepted": verdict.accepted,
                    "blamed": verdict.blamed, "stats": [asdict(s) for s in verdict.stage_stats]})  # fmt: skip
    return out


def replay_windows(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Feed one group's files in order to a member's window as the judge does; per file the verdict.
    Every member of the group sees the same batches, so one window stands for each member's."""
    window: list[dict[str, Any]] = []
    blamed: list[int | None] = []
    worst: dict[int, float] = {}  # stage → highest pooled mean judged (≥ min_chunks)
    for n, batch in enumerate(batches):
        if not batch["accepted"]:
            blamed.append(batch["blamed"])  # judged chunk by chunk; not fed to the windows
            continue
        stats = [StageStats(**s) for s in batch["stats"]]
        window = [*window, window_entry("g", 0, str(n), stats)][-POOL_FILES:]
        pooled, files = pool(window, "g", 0)
        for k, s in enumerate(pooled):
            if s.chunks >= TINY_POOLED.min_chunks:
                worst[k] = max(worst.get(k, 0.0), pooled_mean(s))
        blamed.append(pooled_blame(pooled, files).blamed)
    return {"blamed": blamed, "pooled_max": worst}


def judged_sequences(batches: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each shape's files on their own (a task's window), and all of them in generated order."""
    by_shape: dict[str, list[dict[str, Any]]] = {}
    for b in batches:
        by_shape.setdefault(b["shape"], []).append(b)
    return {**by_shape, "mixed": batches}


def lowest_pooled(batches: list[dict[str, Any]], stage: int) -> float | None:
    """The cheater's smallest pooled mean at its own stage over any judged window of its files."""
    window: list[dict[str, Any]] = []
    low: float | None = None
    for n, batch in enumerate(batches):
        if not batch["accepted"]:
            continue
        window = [*window, window_entry("g", 0, str(n), [StageStats(**s) for s in batch["stats"]])]
        pooled, _ = pool(window[-POOL_FILES:], "g", 0)
        if pooled[stage].chunks >= TINY_POOLED.min_chunks:
            value = pooled_mean(pooled[stage])
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


def analyse(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    honest: dict[str, Any] = {"rows": 0, "files": 0, "sequences": 0, "files_blamed": 0, "worst": {}}
    cheats: list[dict[str, Any]] = []
    for key, batches in runs.items():
        members, stage = (int(x) for x in key.split(":"))
        for name, seq in judged_sequences(batches).items():
            got = replay_windows(seq)
            last = members - 1
            if stage < 0:
                honest["files"] += len(seq) if name != "mixed" else 0
                honest["rows"] += sum(b["rows"] for b in seq) if name != "mixed" else 0
                honest["sequences"] += 1
                honest["files_blamed"] += sum(b is not None for b in got["blamed"])
                for k, v in got["pooled_max"].items():
                    where = f"{members}:{'last' if k == last else k}"
                    honest["worst"][where] = round(max(honest["worst"].get(where, 0.0), v), 4)
                continue
            first = next((i for i, b in enumerate(got["blamed"]) if b is not None), None)
            wrong = sorted({b for b in got["blamed"] if b is not None and b != stage})
            low = lowest_pooled(seq, stage)
            amp = amplification(seq, stage, members)
            cheats.append({"members": members, "stage": stage, "shape": name, "files": len(seq),
                           "chunk_blamed_files": sum(not b["accepted"] for b in seq),
                           "blamed_after_files": None if first is None else first + 1,
                           "blamed_stage": None if first is None else got["blamed"][first],
                           "others_blamed": wrong, "weakest_pooled": None if low is None else round(low, 4),
                           "amplification": amp,
                           "caught": first is not None and got["blamed"][first] == stage
                           and not wrong})  # fmt: skip
    return {"limits": asdict(TINY_POOLED), "pool_files": POOL_FILES, "honest": honest, "cheats": cheats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", type=Path, help="judged batches of an earlier run")
    args = parser.parse_args()
    torch.set_num_threads(2)
    started = time.perf_counter()
    if args.source:
        runs = json.loads(args.source.read_text())
    else:
        runs = {}
        for members in (2, 3):
            runs[f"{members}:-1"] = generate(members, -1, HONEST[members])
            print(f"honest {members} members: {time.perf_counter() - started:.0f} s", flush=True)
        for members, stage in POSITIONS:
            runs[f"{members}:{stage}"] = generate(members, stage, CHEAT[members])
            print(f"weights at stage {stage} of {members}: {time.perf_counter() - started:.0f} s", flush=True)
        OUT.mkdir(exist_ok=True)
        (OUT / "pipeline_pooled_batches.json").write_text(json.dumps(runs))
    result = analyse(runs)
    result["seconds"] = round(time.perf_counter() - started, 1)
    (OUT / "pipeline_pooled.json").write_text(json.dumps(result, indent=1))
    h = result["honest"]
    print(f"limits: {result['limits']}, window: {POOL_FILES} files")
    print(f"honest: {h['rows']} rows in {h['files']} files, {h['sequences']} windows replayed, "
          f"{h['files_blamed']} files with a member blamed")  # fmt: skip
    print("worst honest pooled mean (members:stage):", h["worst"])
    print(f"{'members':>7s} {'stage':>5s} {'shape':>6s} {'files':>5s} {'chunk-blamed':>12s} "
          f"{'blamed after':>12s} {'weakest pooled':>14s} caught amplified")  # fmt: skip
    for c in result["cheats"]:
        print(f"{c['members']:>7d} {c['stage']:>5d} {c['shape']:>6s} {c['files']:>5d} "
              f"{c['chunk_blamed_files']:>12d} {c['blamed_after_files']!s:>12s} "
              f"{c['weakest_pooled']!s:>14s} {c['caught']!s:>6s} {c['amplification']}")  # fmt: skip
    caught = sum(c["caught"] for c in result["cheats"])
    print(f"cheat sequences caught (exactly the cheater): {caught}/{len(result['cheats'])}; "
          f"{result['seconds']} s")  # fmt: skip


if __name__ == "__main__":
    main()
