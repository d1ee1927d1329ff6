# ruff: noqa: E501
"""Calibration across model shapes: one record per shape, and the table of docs/validator.md.

For the shipped tiny model and the random-weight shapes of `workloads/model/shapes.py` (tiny-long,
small, medium, and qwen-0.5b: the width and depth of Qwen2-0.5B), runs what `intellect-validator
calibrate` runs (workloads/inference/judge/calibrate.py): honest files from the inference workload at generation
batches 1-64 and 1-2 threads (and one-token rows), recomputed at prefill batch 1 and 64; the cheats
(fp16 and int8 weights, N(0, 1e-2) and N(0, 1e-3) noise on every matrix, another seed, one
perturbed layer);
the limits derived; every honest file judged again (false positives) and each cheat graded. Prints
per shape the honest worst and the limit of each model-dependent statistic, and each cheat's lowest
value over its limit (the detection margin: >= 1.25 is strong evidence, slashed; 1-1.25 marginal,
not paid; < 1 not caught by that statistic).

    .venv/bin/python bench/calibrate_shapes.py                       # every shape, full grid
    .venv/bin/python bench/calibrate_shapes.py --shape small --quick
    .venv/bin/python bench/calibrate_shapes.py --write               # also (re)writes workloads/inference/judge/calibrations/<shape>.json

`--write` leaves workloads/inference/judge/calibrations/tiny.json alone: the tiny model's record keeps the limits the
soak of ten loaded devnet runs measured (bench/devnet_soak.py); this bench's tiny figures are the
cross-check printed beside them.

The tiny model trains (`--train-steps`, 4 by default: checkpoints measured too); random weights do
not learn string reversal, so their records are made on the base weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workloads.inference.judge.calibrate import CHEATS, Grid, calibrate  # noqa: E402
from workloads.inference.judge.calibration import SHIPPED, find_calibration  # noqa: E402
from workloads.model.shapes import SHAPES, build_model_dir  # noqa: E402

ALL = ["tiny", *SHAPES]
MODELS = ROOT / "bench" / "out" / "models"
KEY_STATS = ("file TOPLOC mantissa mean", "file share of chunks with median >= 1")


def run(shape: str, quick: bool, train_steps: int, tokens: int) -> dict:
    model = "tiny" if shape == "tiny" else str(build_model_dir(shape, MODELS))
    grid = Grid.quick(tokens) if quick else Grid(max_new_tokens=tokens)
    grid.train_steps = train_steps if shape == "tiny" else 0
    started = time.time()
    record = calibrate(  # base: the shipped record's other backends' parts (vLLM's) are kept
        model, Path(tempfile.mkdtemp(prefix=f"calibrate-{shape}-")), grid, name=shape, base=find_calibration(model),
        made_by=f".venv/bin/python bench/calibrate_shapes.py --shape {shape}" + (" --quick" if quick else ""),
        progress=lambda m: print(f"  [{shape} {time.time() - started:5.0f}s] {m}", file=sys.stderr, flush=True),
    )  # fmt: skip
    return record.model_dump()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", action="append", choices=ALL, help="shape (repeat); default: all")
    parser.add_argument("--quick", action="store_true", help="generation batches 1 and 16, one file a setting")
    parser.add_argument("--train-steps", type=int, default=4, help="the tiny model's training run")
    parser.add_argument("--tokens", type=int, default=32, help="max_new_tokens of the honest files")
    parser.add_argument("--write", action="store_true", help="write the records to workloads/inference/judge/calibrations/")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    records = {s: run(s, args.quick, args.train_steps, args.tokens) for s in args.shape or ALL}
    if args.write:  # the tiny model's shipped record rests on the soak too (docs/validator.md): kept
        for shape, record in records.items():
            if shape != "tiny":
                (SHIPPED / f"{shape}.json").write_text(json.dumps(record, indent=1) + "\n")
    out = ROOT / "bench" / "out" / "calibrate_shapes.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=1) + "\n")
    if args.json:
        print(json.dumps(records, indent=1))
        return
    print(f"{'shape':10s} {'hidden×layers':>13s} {'files':>6s} {'FP':>5s}  {'statistic':38s} {'worst honest':>12s} {'limit':>7s}   cheats' lowest value / limit")
    for shape, r in records.items():
        m = r["measured"]
        dims = f"{m['shape']['hidden_size']}×{m['shape']['num_hidden_layers']}"
        fp = f"{m['false_positives']['failing']}/{m['false_positives']['recomputations']}"
        for i, row in enumerate(x for x in m["statistics"] if x["statistic"] in KEY_STATS):
            cheats = "  ".join(f"{k}: {v}" for k, v in row["cheats_over_limit"].items())
            head = f"{shape:10s} {dims:>13s} {m['honest_files']:>6d} {fp:>5s}" if i == 0 else " " * 37
            print(f"{head}  {row['statistic']:38s} {row['worst_honest']:>12.3f} {row['limit']:>7.3f}   {cheats}")
        caught = "  ".join(f"{k}: {v['strong']}s/{v['marginal']}m/{v['none']}-" for k, v in m["cheats_caught"].items())
        print(f"{'':37s}  graded (strong/marginal/missed): {caught}   ({m['seconds']} s)")
    print(f"cheats: {', '.join(CHEATS)}; records in {out}")


if __name__ == "__main__":
    main()
