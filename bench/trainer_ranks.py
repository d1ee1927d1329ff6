"""The trainer over 1 and N processes, side by side: `python bench/trainer_ranks.py [--shapes tiny small]
[--ranks 1 2] [--steps 4] [--json]`.

Each run is the command a user runs (`intellect-train --cpu-demo --nproc N`) over the same synthetic
rollout files (tests/support/rollout_files.py: 288 informative rows a step, waiting from the start, so
steps run back to back). Per run it reads the step manifests the trainer publishes and prints:

- s/step: the mean of the steps' own `seconds` (collect excluded), the first step left out (warm-up);
- tokens/step: output tokens trained on a step (each taken `updates` times);
- state MB/rank: weights, frozen reference and optimizer state the busiest rank holds (its shards);
- peak RSS MB/rank: the busiest rank's peak resident memory (Python, torch and the allocator included);
- start-up s: wall time to the first step's start (imports, model load, process group, sharding);
and, against N = 1 on the same shape, the speed ratio, the memory ratios and how far N ranks' first step
lands from one process's: the gap between the two step-1 weights over the size of the update, whole model
(tests/trainer/test_ranks.py asserts it below 1e-4 on tiny; measured 8.4e-6 on tiny, 5.2e-6 on small).
On a CPU the point of sharding is memory per rank (≈ 1/N of the state); the speed is as measured on this
machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.rollout_files import write_files  # noqa: E402
from workloads.model.shapes import build_model_dir  # noqa: E402


def first_step_gap(model: str, work: Path, ranks: int) -> float:
    """‖W₁(N ranks) − W₁(1 process)‖ / ‖W₁(1 process) − W₀‖ over the whole model."""
    import torch
    from safetensors.torch import load_file

    from workloads.model.loading import load_model

    before = {k: v.float() for k, v in load_model(model, dtype=torch.float32).state_dict().items()}
    one = load_file(str(work / "ck-1" / "step_1.safetensors"))
    many = load_file(str(work / f"ck-{ranks}" / "step_1.safetensors"))
    gap = sum(float((many[k].float() - one[k].float()).norm()) ** 2 for k in one) ** 0.5
    moved = sum(float((one[k].float() - before[k]).norm()) ** 2 for k in one) ** 0.5
    return gap / moved


def run(model: str, ranks: int, steps: int, work: Path) -> dict[str, float]:
    rollouts, out = work / "rollouts", work / f"ck-{ranks}"
    if not rollouts.exists():
        for step in range(steps):
            write_files(rollouts, 9, seed=100 + step, step=step)
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_")}
    env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // ranks))  # the cores shared out
    # Threads that sleep when idle: spinning ones, on a machine with other work, made one process
    # with 2 threads 20x slower (48.9 against 2.25 s a step, measured at load 9).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    command = [sys.executable, "-m", "workloads.trainer", "--cpu-demo", "--model", model,
               "--rollouts", str(rollouts), "--output-dir", str(out), "--max-steps", str(steps),
               "--rows-per-step", "256", "--vote-window-seconds", "0", "--port", "0", "--poll-seconds", "0.1",
               "--nproc", str(ranks)]  # fmt: skip
    began = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    wall = time.time() - began
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    manifests = [json.loads((out / f"step_{s}.json").read_text()) for s in range(1, steps + 1)]
    timed = [m["metrics"] for m in manifests[1:]] or [manifests[0]["metrics"]]
    first = manifests[0]
    return {
        "ranks": ranks,
        "seconds_per_step": sum(m["seconds"] for m in timed) / len(timed),
        "tokens_per_step": sum(m["tokens"] for m in timed) / len(timed),
        "updates_per_step": sum(m["updates"] for m in timed) / len(timed),
        "state_mb_per_rank": max(m["state_mb"] for m in timed),
        "peak_rss_mb_per_rank": max(m["peak_rss_mb"] for m in timed),
        "startup_seconds": first["created_at"] - first["metrics"]["seconds"] - began,
        "wall_seconds": wall,
    }


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--shapes", nargs="+", default=["tiny", "small"], help="tiny, or shapes of "
                        "workloads/model/shapes.py (small, medium, qwen-0.5b)")  # fmt: skip
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            model = "tiny" if shape == "tiny" else str(build_model_dir(shape, Path(tmp) / "models"))
            work = Path(tmp) / shape
            base: dict[str, float] | None = None
            for ranks in args.ranks:
                row = {"shape": shape, **run(model, ranks, args.steps, work)}
                base = base or row
                row["speed_vs_1"] = base["seconds_per_step"] / row["seconds_per_step"]
                row["state_vs_1"] = row["state_mb_per_rank"] / base["state_mb_per_rank"]
                row["rss_vs_1"] = row["peak_rss_mb_per_rank"] / base["peak_rss_mb_per_rank"]
                row["step_gap_vs_1"] = first_step_gap(model, work, ranks) if ranks != base["ranks"] else 0.0
                rows.append(row)
                if not args.json:
                    print(f"{shape} x{ranks}: {row['seconds_per_step']:.2f} s/step", file=sys.stderr,
                          flush=True)  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"machine: {os.cpu_count()} CPUs; {args.steps} steps of 288 rows (first left out); "
          "cpu-demo settings")  # fmt: skip
    print("| shape | ranks | s/step | tokens/step | updates | state MB/rank | peak RSS MB/rank | start-up s "
          "| speed vs 1 | state vs 1 | RSS vs 1 | step-1 gap vs 1 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['ranks']} | {r['seconds_per_step']:.2f} | {r['tokens_per_step']:.0f} | "
              f"{r['updates_per_step']:.0f} | {r['state_mb_per_rank']:.1f} | "
              f"{r['peak_rss_mb_per_rank']:.0f} | {r['startup_seconds']:.1f} | {r['speed_vs_1']:.2f}x | "
              f"{r['state_vs_1']:.2f} | {r['rss_vs_1']:.2f} | {r['step_gap_vs_1']:.1e} |")


if __name__ == "__main__":
    main()
