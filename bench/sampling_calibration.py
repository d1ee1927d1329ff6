# ruff: noqa: E501
"""Calibrate the Gumbel sampling check on trained checkpoints, where honest near-ties live.

`bench/validator_calibration.py` measures the base model on the default prompts. An honest node was
slashed in a demo run on a step-1 checkpoint (one token of a 5-token reversal row replayed 0.21 below
the seed's Gumbel maximum; the limit was 0.2): generation (batched decode, KV cache, left padding)
and the validator's prefill round bf16 differently, and where the two best perturbed scores are
nearly tied the replay can put the other one first. This script measures how often and how far.

1. Trains the tiny model with GRPO on string reversal for --steps steps (two in-process inference
   workloads + the trainer, the demo's settings), keeping every checkpoint.
2. For each of a few checkpoints, generates honest files at generation batch sizes 1/4/16/64 and
   1 or 2 threads (the demo's task: 4 completions, 16 new tokens; plus the default 32-token task).
3. Recomputes every file as the validator does (prefill batch 64, and 1) and collects the gap of
   every output token: max perturbed score minus the claimed token's perturbed score.
4. Beside it, what cheats look like to the same statistics: greedy claimed as Gumbel, and a steering
   cheat that swaps in the runner-up wherever it is within 1.0 (one token per row, or every one).

Prints the honest distribution (quantiles, worst token, tokens and rows above the near-tie level,
worst count in one row, the share of near-tie tokens over a file) beside the thresholds and margins.

    .venv/bin/python bench/sampling_calibration.py            # 12 steps, >= 10,000 honest rows
    .venv/bin/python bench/sampling_calibration.py --quick    # 3 steps, a few thousand rows
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workloads.inference.judge.checks.tokens import token_checks  # noqa: E402
from workloads.inference.judge.thresholds import ValidationThresholds  # noqa: E402
from workloads.inference.settings import InferenceSettings  # noqa: E402
from workloads.inference.workload import InferenceWorkload  # noqa: E402
from workloads.model.loading import load_model, load_weights  # noqa: E402
from workloads.model.prefill import prefill_batch  # noqa: E402
from workloads.model.sampler import replay_fault  # noqa: E402
from workloads.rollouts import Rollout, read_rollouts  # noqa: E402
from workloads.trainer.loop import Trainer  # noqa: E402
from workloads.trainer.settings import TrainerSettings  # noqa: E402
from workloads.trainer.sources import LocalDirSource  # noqa: E402


def node(name: str) -> str:
    return "0x" + hashlib.sha256(name.encode()).hexdigest()[:40]


def train(work: Path, steps: int) -> Path:
    """GRPO on reversal for `steps` steps; every checkpoint kept in work/ckpt."""
    settings = TrainerSettings.for_cpu_demo(output_dir=work / "ckpt", rollouts=str(work / "train-rollouts"),
                                            max_steps=steps, keep=steps + 1)  # fmt: skip
    trainer = Trainer(settings, LocalDirSource(work / "train-rollouts"))
    workers = [
        InferenceWorkload(InferenceSettings(
            node_address=node(f"trainer-feed-{i}"), output_dir=work / "train-rollouts", dataset="reverse",
            batch_size=16, n=4, max_new_tokens=16, step=0,
            checkpoint_source=str(work / "ckpt" / "step_{step}.safetensors"), checkpoint_cache=work / f"cache-{i}",
        ))
        for i in (1, 2)
    ]  # fmt: skip
    while trainer.step < steps:
        for w in workers:
            w.s.step = trainer.step
            w.run_batch()
        trainer.collect()
        if trainer.ready():
            trainer.train_step()
            print(f"  trained step {trainer.step}", flush=True)
    return work / "ckpt"


def generate(work: Path, ckpt: Path, step: int, batch_size: int, threads: int, batches: int, task: str) -> list[Path]:
    out = work / f"honest-{task}-s{step}-b{batch_size}-t{threads}"
    torch.set_num_threads(threads)
    reverse = task == "reverse"
    w = InferenceWorkload(InferenceSettings(
        node_address=node(out.name), output_dir=out, dataset="reverse" if reverse else "demo", batch_size=batch_size,
        n=4, max_new_tokens=16 if reverse else 32, step=step,
        checkpoint_source=str(ckpt / "step_{step}.safetensors") if step else None, checkpoint_cache=work / "cache-gen",
    ))  # fmt: skip
    for _ in range(batches):
        w.run_batch()
    torch.set_num_threads(2)
    return sorted(out.glob("*.parquet"))


def recompute_gaps(model: torch.nn.Module, rows: list[Rollout], prefill: int) -> list[torch.Tensor]:
    """Per row: every output token's gap, as the validator computes it."""
    gaps: list[torch.Tensor] = []
    for s in range(0, len(rows), prefill):
        chunk = rows[s : s + prefill]
        result = prefill_batch(model, [r.input_tokens for r in chunk], [r.output_tokens for r in chunk], 1.0, 0)
        g, _ = token_checks(chunk, result)
        gaps += g
    return gaps


def runner_up_gaps(model: torch.nn.Module, rows: list[Rollout], cap: float, every: bool) -> list[torch.Tensor]:
    """A steering cheat's gaps: at the first position (or every position) where the runner-up of the
    seed's perturbed scores is within `cap` of the maximum, claim the runner-up. Teacher-forced on the
    honest prefix, which is what the validator replays."""
    from workloads.model import sampler

    out = []
    for s in range(0, len(rows), 64):
        chunk = rows[s : s + 64]
        result = prefill_batch(model, [r.input_tokens for r in chunk], [r.output_tokens for r in chunk], 1.0, 0)
        for r, p in zip(chunk, result, strict=True):
            logits = p.logits.float() / r.temperature
            noise = sampler.noise_matrix([r.seed] * len(r.output_tokens), list(range(len(r.output_tokens))), logits.shape[-1])
            top2 = (logits + noise).topk(2, dim=-1).values
            spacing = top2[:, 0] - top2[:, 1]
            gaps = torch.zeros(len(r.output_tokens))
            for i in torch.nonzero(spacing <= cap).flatten().tolist():
                gaps[i] = float(spacing[i])
                if not every:
                    break
            out.append(gaps)
    return out


def summary(gaps: list[torch.Tensor], th: ValidationThresholds) -> dict[str, float]:
    flat = torch.cat(gaps).numpy() if gaps else np.zeros(0)
    per_row = np.array([int((g > th.sampling_tolerance).sum()) for g in gaps])
    failing = sum(1 for g in gaps if replay_fault(g, th.replay_limits()))
    return {
        "rows": len(gaps), "tokens": int(flat.size),
        "p99.9 gap": float(np.quantile(flat, 0.999)) if flat.size else 0.0,
        "max gap": float(flat.max()) if flat.size else 0.0,
        "tokens > near-tie": int((flat > th.sampling_tolerance).sum()),
        "rows with > 1": int((per_row > 1).sum()),
        "max in one row": int(per_row.max()) if per_row.size else 0,
        "rows failing": failing,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 steps, a few thousand rows")
    parser.add_argument("--steps", type=int, default=None, help="trainer steps (default 12; 3 with --quick)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    steps = args.steps or (3 if args.quick else 12)
    th = ValidationThresholds.defaults()  # the defaults this bench calibrates, whatever the environment
    started = time.time()
    torch.set_num_threads(2)
    work = Path(tempfile.mkdtemp(prefix="intellect-sampling-calibration-"))
    print(f"training {steps} steps in {work}", flush=True)
    ckpt = train(work, steps)
    checkpoints = sorted({0, 1, 2, steps // 2, steps})
    # (generation batch size, threads, batches) per checkpoint: 4 completions per prompt
    plans = [(1, 1, 4), (4, 2, 4), (16, 1, 2), (64, 2, 1)] if args.quick else [
        (1, 1, 16), (4, 1, 8), (4, 2, 8), (16, 1, 6), (16, 2, 6), (64, 2, 3), (64, 1, 2),
    ]  # fmt: skip
    honest: dict[int, list[Path]] = {}
    for step in checkpoints:
        for task in ("reverse", "default"):
            for bs, threads, batches in plans:
                honest.setdefault(step, []).extend(generate(work, ckpt, step, bs, threads, batches, task))
        print(f"  generated step {step}: {len(honest[step])} files", flush=True)
    gaps: dict[str, list[torch.Tensor]] = {"honest (prefill 64)": [], "honest (prefill 1)": []}
    steer_one: list[torch.Tensor] = []
    steer_all: list[torch.Tensor] = []
    file_shares: list[float] = []
    for step, files in honest.items():
        model = load_model("tiny")
        if step:
            load_weights(model, ckpt / f"step_{step}.safetensors")
        for f in files:
            rows, _ = read_rollouts(f)
            g64 = recompute_gaps(model, rows, 64)
            gaps["honest (prefill 64)"] += g64
            gaps["honest (prefill 1)"] += recompute_gaps(model, rows, 1)
            tokens = sum(len(g) for g in g64)
            file_shares.append(sum(int((g > th.sampling_tolerance).sum()) for g in g64) / tokens)
        sample = [r for f in files[:: max(1, len(files) // 12)] for r in read_rollouts(f)[0]]
        steer_one += runner_up_gaps(model, sample, th.sampling_max_gap, every=False)
        steer_all += runner_up_gaps(model, sample, th.sampling_max_gap, every=True)
    table = {k: summary(v, th) for k, v in gaps.items()}
    table["cheat: runner-up on 1 token a row"] = summary(steer_one, th)
    table["cheat: runner-up wherever within cap"] = summary(steer_all, th)
    result = {
        "thresholds": {"near-tie level (sampling_tolerance)": th.sampling_tolerance, "cap (sampling_max_gap)": th.sampling_max_gap,
                       "near ties allowed a row": th.sampling_max_near_ties},
        "steps": steps, "checkpoints": checkpoints, "table": table,
        "worst honest file near-tie share": max(file_shares), "seconds": round(time.time() - started),
    }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"\n{steps} trainer steps, checkpoints {checkpoints}, {result['seconds']} s")
    print(f"thresholds: {result['thresholds']}")
    cols = list(next(iter(table.values())).keys())
    print(f"{'':40}" + "".join(f"{c:>18}" for c in cols))
    for name, row in table.items():
        print(f"{name:40}" + "".join(f"{row[c]:>18.3f}" if isinstance(row[c], float) else f"{row[c]:>18}" for c in cols))
    print(f"worst honest file share of near-tie tokens: {result['worst honest file near-tie share']:.4f}")


if __name__ == "__main__":
    main()
