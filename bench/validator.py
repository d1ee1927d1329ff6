"""Validator throughput vs one worker's generation, on the same rollouts, side by side.

One worker generates a batch of 16 sequences (with TOPLOC proofs, as the inference workload does);
the validator recomputes them the way `workloads/inference/judge/checks/model.py` does (one batched
prefill, then
termination, Gumbel replay, logprobs, TOPLOC per chunk and per file). Output lengths 32, 256 and
1,024 tokens (EOS off: fixed lengths); the ratio validation tokens/s ÷ generation tokens/s is how
many such workers one validator keeps up with (on the same hardware). Targets: ≥ 25× at 256 tokens
(the SYNTHETIC-2 median), aim 100× at 1,024.

    .venv/bin/python bench/validator.py                         # every shape
    .venv/bin/python bench/validator.py --size tiny-long --size small --json

Shapes (workloads/model/shapes.py, random weights from a seed, bf16): "tiny-long" is the shipped
model's shape (hidden 128 × 4 layers) with room for 2,048 positions, "small" 512 × 8, "medium"
1024 × 12, "qwen-0.5b" the width and depth of Qwen2-0.5B (896 × 24). Each is judged with the limits
of its shipped calibration record (workloads/inference/judge/calibrations/<shape>.json, made by
bench/calibrate_shapes.py, the calibrate command's measurement): the honest batch must pass.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workloads.datasets import load_dataset  # noqa: E402
from workloads.inference.generate import make_rollouts  # noqa: E402
from workloads.inference.judge.calibration import resolve_limits  # noqa: E402
from workloads.inference.judge.checks.model import recompute  # noqa: E402
from workloads.inference.selection import plan_batch  # noqa: E402
from workloads.model.backends import TorchBackend  # noqa: E402
from workloads.model.loading import load_model, load_tokenizer  # noqa: E402
from workloads.model.shapes import SHAPES, build_model_dir  # noqa: E402

NODE = "0x5aeda56215b167893e80b4fe645ba6d5bab767de"
MODELS = ROOT / "bench" / "out" / "models"


def model_and_limits(size: str, batch: int):  # noqa: ANN201
    """The shape's model folder (seeded random weights) and the limits of its shipped calibration record."""
    folder = build_model_dir(size, MODELS)
    limits = resolve_limits(folder, {"prefill_batch_size": batch})
    if limits.record is None:
        fix = f".venv/bin/python bench/calibrate_shapes.py --shape {size} --write"
        sys.exit(f"no calibration record for {size}: run {fix}")
    return load_model(folder), limits.thresholds


def measure(size: str, length: int, batch: int, repeats: int) -> dict[str, float]:
    tok = load_tokenizer("tiny")
    model, th = model_and_limits(size, batch)
    backend = TorchBackend(model, -1, tok.pad_token_id)  # EOS -1 never matches: fixed-length decoding
    records = load_dataset("demo")
    plan = plan_batch(NODE, 1, len(records), batch, 1, [8])
    gen_s, val_s = [], []
    rows = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        rows, _ = make_rollouts(
            backend, tok, records, plan, step=1, max_new_tokens=length, temperature=1.0, length_penalty=3e-4
        )
        gen_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        findings, _ = recompute(
            model, rows, eos_token_id=-1, pad_token_id=tok.pad_token_id, max_new_tokens=length, th=th
        )
        val_s.append(time.perf_counter() - t0)
        # an honest batch passes: we time the real path, not a failure
        assert not findings, [f.reason for f in findings]
    tokens = sum(len(r.output_tokens) for r in rows)
    gen, val = min(gen_s), min(val_s)
    return {
        "size": size,
        "tokens": length,
        "batch": batch,
        "generation_tok_s": tokens / gen,
        "validation_tok_s": tokens / val,
        "ratio": gen / val,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", action="append", choices=sorted(SHAPES), help="model shape (repeat)")
    parser.add_argument("--tokens", action="append", type=int, help="output length (repeat)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    results = [
        measure(size, length, args.batch, args.repeats)
        for size in (args.size or list(SHAPES))
        for length in (args.tokens or [32, 256, 1024])
    ]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'model':10s} {'tokens':>7s} {'generate tok/s':>15s} {'validate tok/s':>15s} {'ratio':>7s}  goal")
    for r in results:
        goal = {256: "≥ 25×", 1024: "aim 100×"}.get(r["tokens"], "")
        print(
            f"{r['size']:10s} {r['tokens']:>7d} {r['generation_tok_s']:>15.0f} "
            f"{r['validation_tok_s']:>15.0f} {r['ratio']:>6.1f}×  {goal}"
        )


if __name__ == "__main__":
    main()
