"""Can a node's window of files tell int8 weights made with vLLM from honest vLLM files (issue 57)?

On the tiny model, int8 weights made with vLLM hide inside the honest spread of single files (the file
TOPLOC mantissa mean: docs/validator.md, "Calibration per generating backend"). A node's window pools
up to 16 files, so its mean is known far better than one file's; this bench measures whether a pooled
limit could separate them, at two task shapes:

- `default`: the calibration grid's shape (the default dataset, rows of up to 32 tokens);
- `demo`: the devnet demo's (string reversal, rows of up to 16 tokens).

Honest files at the base weights and at each checkpoint of a short GRPO run (the calibration's own
`train`), int8 files (per-row round to nearest, the calibration's cheat) at the base weights; all made
by vLLM's engine in its environment (`make vllm`), recomputed here by the validator's torch prefill
(`recompute`, the shipped defaults). Printed per shape and setting: the files' pooled mantissa mean (a
node's window), the spread of the file means; then int8's pooled mean over the highest honest setting's,
per shape, and the honest means of one shape over the other's.

    .venv/bin/python bench/vllm_windows.py --steps 4 --files 8       # about 4 minutes here
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NODE = "0x00000000000000000000000000000000000000b7"
SHAPES: dict[str, dict[str, Any]] = {
    "default": {"max_new_tokens": 32},
    "demo": {"max_new_tokens": 16, "dataset": "reverse", "target_lengths": [8]},
}


def make(out: Path, ckpt: Path, steps: int, files: int) -> None:
    """In vLLM's environment: every shape's honest files (base, each step) and int8 files."""
    from workloads.inference.judge.calibrate_files import cheat_weights
    from workloads.inference.settings import InferenceSettings
    from workloads.inference.workload import InferenceWorkload
    from workloads.model.loading import load_model

    def workload(folder: Path, **extra: Any) -> InferenceWorkload:
        return InferenceWorkload(InferenceSettings(node_address=NODE, output_dir=folder, batch_size=16, n=4,
                                                   backend="vllm", device="cpu", **extra))  # fmt: skip

    for shape, extra in SHAPES.items():
        for step in range(steps + 1):
            at = {"step": step, "checkpoint_source": str(ckpt / "step_{step}.safetensors"),
                  "checkpoint_cache": out / f"cache-{shape}"} if step else {}  # fmt: skip
            made = workload(out / shape / f"step-{step}", **extra, **at)
            for _ in range(files):
                made.run_batch()
        made = workload(out / shape / "int8", **extra)
        int8 = load_model("tiny")
        cheat_weights(int8, "int8 weights")
        assert made.vllm is not None
        made.vllm.load_state(dict(int8.state_dict()), serving="int8 weights")
        for _ in range(files):
            made.run_batch()


def measure(out: Path, ckpt: Path) -> list[dict]:
    """Every file recomputed by the torch prefill under the shipped defaults; its figures by setting."""
    from workloads.inference.judge.checks.model import recompute
    from workloads.inference.judge.thresholds import ValidationThresholds
    from workloads.model.loading import load_model, load_tokenizer, load_weights
    from workloads.rollouts import read_rollouts

    tok, th = load_tokenizer("tiny"), ValidationThresholds.defaults()
    rows_out = []
    for shape, extra in SHAPES.items():
        for folder in sorted((out / shape).iterdir(), key=lambda p: p.name):  # step-0..N, int8
            step = int(folder.name.split("-")[1]) if folder.name.startswith("step-") else 0
            model = load_model("tiny")
            if step:
                load_weights(model, ckpt / f"step_{step}.safetensors")
            means, chunks = [], []
            for path in sorted(folder.glob("*.parquet")):
                rows, _ = read_rollouts(path)
                _, stats = recompute(model, rows, eos_token_id=int(tok.eos_token_id),
                                     pad_token_id=int(tok.pad_token_id),
                                     max_new_tokens=int(extra["max_new_tokens"]), th=th)  # fmt: skip
                means.append(stats.mant_mean)
                chunks.append(stats.chunks)
            pooled = sum(m * c for m, c in zip(means, chunks, strict=True)) / max(1, sum(chunks))
            rows_out.append({
                "shape": shape, "setting": folder.name, "files": len(means), "chunks": sum(chunks),
                "pooled_mean": round(pooled, 4), "worst_file": round(max(means), 4),
                "file_sd": round(statistics.stdev(means), 4) if len(means) > 1 else 0.0,
            })  # fmt: skip
    return rows_out


def summary(rows: list[dict]) -> dict:
    honest = {s: max(r["pooled_mean"] for r in rows if r["shape"] == s and r["setting"] != "int8")
              for s in SHAPES}  # fmt: skip
    lowest = {s: min(r["pooled_mean"] for r in rows if r["shape"] == s and r["setting"] != "int8")
              for s in SHAPES}  # fmt: skip
    int8 = {s: next(r["pooled_mean"] for r in rows if r["shape"] == s and r["setting"] == "int8")
            for s in SHAPES}  # fmt: skip
    return {
        "int8_over_highest_honest": {s: round(int8[s] / honest[s], 3) for s in SHAPES},
        "demo_honest_over_default_honest": round(lowest["demo"] / honest["default"], 3),
        "default_int8_over_demo_lowest_honest": round(int8["default"] / lowest["demo"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps trained (checkpoints measured)")
    parser.add_argument("--files", type=int, default=8, help="files per setting (16 prompts x 4 rows)")
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a temp dir)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--make", nargs=2, metavar=("OUT", "CKPT"), help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    if args.make:
        make(Path(args.make[0]), Path(args.make[1]), args.steps, args.files)
        return
    from workloads.inference.judge.calibrate import train
    from workloads.inference.judge.calibrate_files import Grid
    from workloads.model.vllm_backend import vllm_python

    out = args.out or Path(tempfile.mkdtemp(prefix="vllm-windows-"))
    ckpt = train("tiny", out, args.steps, Grid(), lambda m: print(m, file=sys.stderr)) if args.steps else out
    subprocess.run([vllm_python(), __file__, "--steps", str(args.steps), "--files", str(args.files),
                    "--make", str(out / "files"), str(ckpt)], check=True, cwd=ROOT)  # fmt: skip
    rows = measure(out / "files", ckpt)
    result = {"rows": rows, **summary(rows)}
    if args.json:
        print(json.dumps(result))
        return
    print("| shape | setting | files | chunks | pooled mantissa mean | file sd | worst file |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['setting']} | {r['files']} | {r['chunks']} | {r['pooled_mean']:.3f} | "
              f"{r['file_sd']:.3f} | {r['worst_file']:.3f} |")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))


if __name__ == "__main__":
    main()
