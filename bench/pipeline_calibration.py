"""Honest pipeline groups, counted: how far each stage's replay lands from its proofs, and how many
honest rows the group validator would reject or blame (the rule: 0).

Runs 2- and 3-member groups of the shipped tiny model (real member processes on loopback) over
prompts of the demo dataset, at batch sizes 1, 8 and 64 and output lengths from 1 to 96 tokens (short
rows on purpose), then judges every batch with `judge_group`. Prints, per stage position, the worst
honest chunk (exponent mismatches, mantissa error mean and median) next to the envelope that blames,
and the count of rejected batches.

    .venv/bin/python bench/pipeline_calibration.py              # ≥ 2,000 honest rows
    .venv/bin/python bench/pipeline_calibration.py --rows 400 --json
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

from workloads.datasets import load_dataset  # noqa: E402
from workloads.model.loading import load_model, load_tokenizer  # noqa: E402
from workloads.pipeline.group import run_local_group  # noqa: E402
from workloads.pipeline.judge.end_to_end import TINY_CLEAN, TINY_INNER, GroupRows, judge_group  # noqa: E402
from workloads.pipeline.member import BatchRequest  # noqa: E402
from workloads.pipeline.stages import boundary_activations, plan_stages  # noqa: E402
from workloads.toploc import ToplocThresholds, verify_proofs_batch  # noqa: E402

SHAPES = [(1, 1), (1, 4), (1, 96), (8, 8), (8, 96), (64, 32), (64, 96)]  # (rows, max new tokens)
ANY = ToplocThresholds(max_exp_mismatches=10**9, max_mant_err_mean=1e300, max_mant_err_median=1e300)


def worst_chunks(model, plans, prompts, outputs, stage_proofs) -> list[tuple[int, float, float, int]]:  # noqa: ANN001
    """Per stage: (worst exponent mismatches, worst mean, worst median, chunks)."""
    seqs = [p + o for p, o in zip(prompts, outputs, strict=True)]
    ids = torch.zeros((len(seqs), max(map(len, seqs))), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    with torch.inference_mode(), boundary_activations(model, plans) as captured:
        model(input_ids=ids, use_cache=False)
    out = []
    for plan in plans:
        b = captured[plan.index][0]
        hs = [b[i, len(p) if plan.last else 0 : len(p) + len(o) - 1] for i, (p, o) in
              enumerate(zip(prompts, outputs, strict=True))]  # fmt: skip
        chunks = [c for v in verify_proofs_batch(hs, stage_proofs[plan.index], ANY) for c in v.chunks]
        out.append((max((c.exp_mismatches for c in chunks), default=0),
                    max((c.mant_err_mean for c in chunks), default=0.0),
                    max((c.mant_err_median for c in chunks), default=0.0), len(chunks)))  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2000, help="honest rows, half with 2 members, half 3")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    tok, model = load_tokenizer("tiny"), load_model("tiny")
    records = load_dataset("demo")
    results = []
    for members in (2, 3):
        plans = plan_stages("tiny", members)
        requests, rows, seed = [], 0, members * 1_000_000
        while rows < args.rows // 2:
            for batch, max_new in SHAPES:
                idx = [(seed + 13 * i) % len(records) for i in range(batch)]
                prompts = [tok(records[i].prompt)["input_ids"] for i in idx]
                requests.append(BatchRequest(prompts, [seed + i for i in range(batch)], max_new, 1.0))
                seed, rows = seed + batch, rows + batch
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as folder:
            run = run_local_group(members, requests, Path(folder), timeout=60)
        if run.errors:
            raise SystemExit(f"a group failed: {run.errors}")
        worst = [(0, 0.0, 0.0, 0)] * members
        rejected = blamed = 0
        for req, outputs in zip(requests, run.batches, strict=True):
            group = GroupRows(req.prompts, outputs[0].tokens, outputs[members - 1].logprobs, req.seeds,
                              [outputs[i].proofs for i in range(members)])  # fmt: skip
            verdict = judge_group(model, plans, group, int(tok.pad_token_id))
            rejected += not verdict.accepted
            blamed += verdict.blamed is not None
            stats = worst_chunks(model, plans, req.prompts, outputs[0].tokens, group.stage_proofs)
            worst = [(max(a[0], b[0]), max(a[1], b[1]), max(a[2], b[2]), a[3] + b[3]) for a, b in
                     zip(worst, stats, strict=True)]  # fmt: skip
        results.append({"members": members, "rows": rows, "batches": len(requests), "rejected": rejected,
                        "blamed": blamed, "seconds": round(time.perf_counter() - started, 1),
                        "stages": [{"stage": i, "chunks": w[3], "exp": w[0], "mean": round(w[1], 3),
                                    "median": w[2]} for i, w in enumerate(worst)]})  # fmt: skip
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for name, env in (("clean (every stage before a blamed one)", TINY_CLEAN),
                      ("inner (outside: the stage is blamed)", TINY_INNER)):
        print(f"{name}: exp <= {env.exp_mismatches}, mean <= {env.mant_mean}, median <= {env.mant_median}")
    print("the last stage is judged on the per-chunk TOPLOC limits (exp <= 12, mean < 8, median < 4)")
    print(f"{'members':>7s} {'rows':>6s} {'rejected':>8s} {'stage':>5s} {'chunks':>6s} {'worst exp':>9s} "
          f"{'worst mean':>10s} {'worst median':>12s}")  # fmt: skip
    for r in results:
        for s in r["stages"]:
            print(f"{r['members']:>7d} {r['rows']:>6d} {r['rejected']:>8d} {s['stage']:>5d} "
                  f"{s['chunks']:>6d} "
                  f"{s['exp']:>9d} {s['mean']:>10.3f} {s['median']:>12.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
