# ruff: noqa: E501
"""Trainer throughput on CPU and the demo run's reward curve (the picture a user looks at first).

Runs the RL loop in one process: two inference workloads (tiny model, string reversal, 16 prompts ×
4 completions each per round) and the trainer with `TrainerSettings.for_cpu_demo()`, for --steps steps.
Prints trainer tokens/s (output tokens trained on, per second of optimizer work) beside the workers'
generation tokens/s, and writes the reward curve as CSV and PNG (matplotlib), plus the held-out
accuracy of the base model and the last checkpoint on 128 reversal prompts × 4 samples.

    .venv/bin/python bench/trainer.py                      # 30 steps, bench/out/reward_curve.{csv,png}
    .venv/bin/python bench/trainer.py --steps 10 --out /tmp/curve
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workloads.datasets import load_dataset  # noqa: E402
from workloads.inference.settings import InferenceSettings  # noqa: E402
from workloads.inference.workload import InferenceWorkload  # noqa: E402
from workloads.model.backends import TorchBackend  # noqa: E402
from workloads.model.loading import load_model, load_tokenizer, load_weights  # noqa: E402
from workloads.trainer.loop import Trainer  # noqa: E402
from workloads.trainer.settings import TrainerSettings  # noqa: E402
from workloads.trainer.sources import LocalDirSource  # noqa: E402
from workloads.verifiers import score  # noqa: E402


def held_out_accuracy(weights: Path | None, prompts: int = 128, samples: int = 4) -> float:
    tok = load_tokenizer("tiny")
    records = load_dataset("reverse")[-prompts:]  # the last 128 tasks: rarely drawn in a 30-step run
    model = load_model("tiny")
    if weights is not None:
        load_weights(model, weights)
    backend = TorchBackend(model, tok.eos_token_id, tok.pad_token_id)
    ids = [tok(r.prompt)["input_ids"] for r in records for _ in range(samples)]
    outs = backend.generate(ids, list(range(len(ids))), max_new_tokens=16, temperature=1.0, capture_hidden=False)
    return float(np.mean([score(records[i // samples], tok.decode(o.tokens, skip_special_tokens=True))
                          for i, o in enumerate(outs)]))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    torch.set_num_threads(2)
    work = Path(tempfile.mkdtemp(prefix="intellect-trainer-bench-"))
    settings = TrainerSettings.for_cpu_demo(output_dir=work / "ckpt", rollouts=str(work / "rollouts"),
                                        max_steps=args.steps, keep=args.steps + 1)  # fmt: skip
    trainer = Trainer(settings, LocalDirSource(work / "rollouts"))
    workers = [
        InferenceWorkload(InferenceSettings(
            node_address="0x" + hashlib.sha256(f"node-{i}".encode()).hexdigest()[:40], output_dir=work / "rollouts",
            dataset="reverse", batch_size=16, n=4, max_new_tokens=16, step=0,
            checkpoint_source=str(work / "ckpt" / "step_{step}.safetensors"), checkpoint_cache=work / f"cache-{i}",
        ))
        for i in (1, 2)
    ]  # fmt: skip
    gen_tokens = gen_seconds = 0.0
    curve: list[dict[str, float]] = []
    started = time.time()
    while trainer.step < args.steps:
        for w in workers:
            w.s.step = trainer.step
            t0 = time.perf_counter()
            report = w.run_batch()
            gen_seconds += time.perf_counter() - t0
            gen_tokens += report.work_units if report else 0
        trainer.collect()
        if trainer.ready():
            m = trainer.train_step()
            curve.append({"step": trainer.step, **m})
    wall = time.time() - started
    train_tokens = sum(c["tokens"] * c.get("updates", settings.updates_per_step) for c in curve)
    train_seconds = sum(c["seconds"] for c in curve)
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = args.out / "reward_curve.csv", args.out / "reward_curve.png"
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["step", "task_reward_mean", "rows", "rows_seen", "kl", "entropy",
                                               "clip_fraction", "grad_norm", "tokens", "seconds"])  # fmt: skip
        writer.writeheader()
        for c in curve:
            writer.writerow({k: c[k] for k in writer.fieldnames})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [c["step"] for c in curve]
    rewards = [c["task_reward_mean"] for c in curve]
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=120)
    ax.plot(steps, rewards, marker="o", markersize=3, label="mean task reward of the step's rollouts")
    window = 5
    if len(rewards) >= window:
        smooth = np.convolve(rewards, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1 :], smooth, linewidth=2.5, label=f"{window}-step mean")
    ax.set_xlabel("trainer step")
    ax.set_ylabel("task reward (string reversal)")
    ax.set_title("GRPO on the tiny model, CPU: 2 inference workers + trainer")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(png_path)
    base, last = held_out_accuracy(None), held_out_accuracy(settings.output_dir / f"step_{args.steps}.safetensors")
    first5, last5 = float(np.mean(rewards[:5])), float(np.mean(rewards[-5:]))
    print(f"steps {args.steps} in {wall:.0f} s wall; reward first 5 steps {first5:.3f} → last 5 {last5:.3f} "
          f"(+{last5 - first5:.3f}); held-out accuracy base {base:.3f} → step {args.steps} {last:.3f}")  # fmt: skip
    print(f"trainer: {train_tokens / train_seconds:.0f} tokens/s ({train_tokens:.0f} tokens over "
          f"{settings.minibatch_rows or 'all'} rows an update, {train_seconds:.1f} s)  |  one worker generating: "
          f"{gen_tokens / gen_seconds:.0f} tokens/s (with proofs)  |  ratio {train_tokens / train_seconds / (gen_tokens / gen_seconds):.1f}×")  # fmt: skip
    print(f"curve: {csv_path} and {png_path}")


if __name__ == "__main__":
    main()
