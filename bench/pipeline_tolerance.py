"""The pipeline replay's forward tolerance per model (issue 55, `workloads/pipeline/judge/tolerance.py`).

Runs honest thread groups (2 and 3 members, batch shapes from 1 row × 1 token to 64 rows) of a model
and groups with a compute-saving cheat at each forwarding stage (`int8`, `fp16`, `bias`, `half-bias`,
`skip-layer`: workloads/pipeline/cheats.py), then prints the honest figures per shape (worst position,
largest file mean and offset, the file nearest its limit), the limits this run derives
(`tolerance_calibration.derive_forward`) and, under the limits the model is judged by (its record's
`pipeline` part, or those derived here where it has none), each cheat's verdicts: files caught by one
file, by a window of the member's files (pooled), or not at all.

    .venv/bin/python bench/pipeline_tolerance.py                      # tiny, 11 shapes × 3 seeds (≈ 4 min)
    .venv/bin/python bench/pipeline_tolerance.py --model small --quick   # the 512 × 8 shape (≈ 5 min)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workloads.inference.judge.calibration import resolve_limits  # noqa: E402
from workloads.model.loading import load_model, load_tokenizer  # noqa: E402
from workloads.model.shapes import build_model_dir  # noqa: E402
from workloads.pipeline.judge.tolerance import ForwardLimits  # noqa: E402
from workloads.pipeline.tolerance_calibration import (  # noqa: E402
    COMPUTE_CHEATS,
    QUICK_SHAPES,
    SHAPES,
    Sample,
    closest,
    derive_forward,
    grade,
    run_samples,
)

FULL_SHAPES = ((1, 1), (1, 8), (1, 48), (4, 48), (8, 1), (8, 24), (16, 48), (32, 16), (64, 1), (64, 8),
               (64, 32))  # fmt: skip


def by_shape(honest: list[Sample], limits: ForwardLimits) -> list[dict[str, Any]]:
    """The honest figures of each batch shape, every group size and stage together."""
    rows = []
    for shape in sorted({(s.rows, s.tokens) for s in honest}):
        mine = [s for s in honest if (s.rows, s.tokens) == shape and s.positions]
        figures = [s.found.figures(limits) for s in mine]
        rows.append({"rows": shape[0], "tokens": shape[1], "files": len(mine),
                     "positions": min(f.positions for f in figures),
                     "worst_position": round(max(f.worst for f in figures), 5),
                     "largest_mean": round(max(f.mean for f in figures), 5),
                     "largest_offset": round(max(f.offset for f in figures), 5),
                     "nearest_limit": round(max(closest(s.found, limits) for s in mine), 3)})  # fmt: skip
    return rows


def graded(m: dict[str, Any]) -> str:
    """What catches a cheat: every file, files above a size, only a window of the member's files, nothing."""
    if m["caught"] == m["files"]:
        return "one file (every file)"
    if m["caught"]:
        return (f"one file: {m['caught']} of {m['files']} (the largest missed: {m['largest_file_missed']} "
                f"positions); the window: {m['window_caught']} of {m['windows']} stage positions")
    if m["window_caught"]:
        return f"only the window ({m['window_caught']} of {m['windows']} stage positions)"
    return "nothing"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny, small (the 512 x 8 shape) or a model folder")
    parser.add_argument("--quick", action="store_true", help="4 shapes, one seed")
    parser.add_argument("--out", type=Path, default=None, help="default: bench/out/pipeline_tolerance*.json")
    args = parser.parse_args()
    name = str(build_model_dir("small", ROOT / "bench/out/models")) if args.model == "small" else args.model
    tok, model = load_tokenizer(name), load_model(name)
    full = SHAPES if args.model != "tiny" else FULL_SHAPES
    shapes, seeds = (QUICK_SHAPES, (1,)) if args.quick else (full, (1, 2, 3))
    started = time.time()

    def progress(message: str) -> None:
        print(f"[{time.time() - started:5.0f} s] {message}", file=sys.stderr, flush=True)

    honest = run_samples(name, model, tok, "none", shapes, seeds, progress)
    derived = derive_forward(honest)
    record = resolve_limits(name, {})
    limits = ForwardLimits.from_record(record.forward) if record.forward else derived
    source = f"record {record.record.name}" if record.forward and record.record else "derived here"
    print(f"{args.model}: limits derived from {len(honest)} honest stage-batches: {derived.figures()}")
    print(f"judged under ({source}): {limits.figures()}")
    print(f"{'shape':>7} {'files':>5} {'n≥':>5} {'worst pos':>9} {'mean':>8} {'offset':>8} {'nearest':>7}")
    shape_rows = by_shape(honest, limits)
    for r in shape_rows:
        print(f"{r['rows']:>3}x{r['tokens']:<3} {r['files']:>5} {r['positions']:>5} "
              f"{r['worst_position']:>9.5f} {r['largest_mean']:>8.5f} {r['largest_offset']:>8.5f} "
              f"{r['nearest_limit']:>7.3f}")  # fmt: skip
    results = {"honest": grade(model, name, tok, honest, limits)}
    for cheat in COMPUTE_CHEATS:
        samples = run_samples(name, model, tok, cheat, shapes, seeds[:1], progress)
        results[cheat] = grade(model, name, tok, samples, limits)
    print(f"{'':11} {'caught':>7} {'file/limit':>10} {'window/limit':>12} {'mean':>8} {'offset':>8}  "
          "caught by")  # fmt: skip
    for kind, m in results.items():
        what = "honest: never guilty" if kind == "honest" else graded(m)
        print(f"{kind:11} {m['caught']:>3}/{m['files']:<3} {m['file_over_limit']:>10.3f} "
              f"{m['window_over_limit']:>12.3f} {m['largest_mean']:>8.5f} {m['largest_offset']:>8.5f}  "
              f"{what}")  # fmt: skip
        m["graded"] = what
    out = args.out or ROOT / "bench/out" / ("pipeline_tolerance.json" if args.model == "tiny"
                                            else f"pipeline_tolerance_{args.model}.json")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "shapes": [list(s) for s in shapes],
                               "seeds": list(seeds), "derived": derived.figures(),
                               "judged_under": limits.figures(), "source": source,
                               "honest_by_shape": shape_rows, "results": results,
                               "seconds": round(time.time() - started, 1)}, indent=1) + "\n")  # fmt: skip
    print(f"wrote {out} ({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
