# ruff: noqa: E501
"""Evidence weighed by its size (issue 54.5): how far the "far row" levels sit above honest noise, and
how often a row carrying another row's proofs reaches them.

One row failing far past anything honest is strong evidence on its own (workloads/inference/judge/
grades.py): a TOPLOC chunk with `toploc_far_factor` (2) times the exponent limit or
`toploc_far_mant_factor` (1.5) times the mantissa-mean limit, a Gumbel gap or a token's logprob error
`row_far_factor` (10) times its limit. This prints, side by side:

1. per shipped calibration record, each far level against the worst honest value the record measured
   (the honest margin: far level / worst honest), the levels resolved as a validator resolves them
   (`resolve_limits`);
2. on honest files of the tiny model made by the inference workload: the worst honest row of each
   statistic, recomputed as the validator does, and how many rows reach a far level (must be 0);
3. the cheat the rule is for: every pair of equal-length, different rows of those files, each row
   judged with the other's proofs: the share that reaches the far TOPLOC level (a row failing only the
   plain limits is "marginal": not paid, never slashed on its own).

    .venv/bin/python bench/far_rows.py               # 8 files of 16 rows (~1 min)
    .venv/bin/python bench/far_rows.py --files 32 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workloads.inference.judge.calibration import SHIPPED, CalibrationRecord, limits_of  # noqa: E402
from workloads.inference.judge.checks.tokens import token_checks  # noqa: E402
from workloads.inference.settings import InferenceSettings  # noqa: E402
from workloads.inference.workload import InferenceWorkload  # noqa: E402
from workloads.model.loading import load_model  # noqa: E402
from workloads.model.prefill import prefill_batch  # noqa: E402
from workloads.rollouts import read_rollouts  # noqa: E402
from workloads.toploc import ToplocThresholds, verify_proofs_batch  # noqa: E402

STATS = {  # record statistic -> (far level from the thresholds, what it is)
    "chunk exponent mismatches": (lambda th: th.toploc_far_factor * th.chunk_max_exp_mismatches, "TOPLOC chunk exponents"),
    "chunk mantissa mean": (lambda th: th.toploc_far_mant_factor * th.chunk_max_mant_mean, "TOPLOC chunk mantissa mean"),
    "Gumbel gap (cap)": (lambda th: th.row_far_factor * th.sampling_max_gap, "Gumbel gap"),
    "token logprob |error| (cap)": (lambda th: th.row_far_factor * th.logprob_tolerance, "token logprob error"),
}


def record_margins() -> list[dict]:
    out = []
    for path in sorted(SHIPPED.glob("*.json")):
        record = CalibrationRecord.model_validate_json(path.read_text())
        th = limits_of(record, {}).thresholds
        worst = {r["statistic"]: r.get("worst_honest") for r in record.measured.get("statistics", [])}
        for stat, (far, label) in STATS.items():
            if worst.get(stat):
                out.append({"record": record.name, "statistic": label, "far level": round(far(th), 3),
                            "worst honest": round(worst[stat], 4), "margin": round(far(th) / worst[stat], 1)})  # fmt: skip
    return out


def tiny_files(count: int, work: Path) -> list[Path]:
    workload = InferenceWorkload(InferenceSettings(
        node_address="0x00000000000000000000000000000000000000fa", output_dir=work, dataset="math",
        batch_size=4, n=4, max_new_tokens=48, target_lengths=[48], length_penalty=0.0,
    ))  # fmt: skip
    return [Path(workload.run_batch().path) for _ in range(count)]  # type: ignore[union-attr]


def measure(paths: list[Path]) -> dict:
    th = limits_of(CalibrationRecord.model_validate_json((SHIPPED / "tiny.json").read_text()), {}).thresholds
    loose = ToplocThresholds(max_exp_mismatches=128, max_mant_err_mean=1e30, max_mant_err_median=1e30)
    model = load_model("tiny")
    honest = {"exp": 0, "mant": 0.0, "gap": 0.0, "logprob": 0.0, "rows": 0, "far rows": 0}
    pairs = reached = same = 0
    for path in paths:
        rows, _ = read_rollouts(path)
        result = prefill_batch(model, [r.input_tokens for r in rows], [r.output_tokens for r in rows], 1.0, 0)
        gaps, logprobs = token_checks(rows, result)
        own = verify_proofs_batch([p.hidden for p in result], [r.proofs for r in rows], loose)
        for i, (r, verdict) in enumerate(zip(rows, own, strict=True)):
            exp = max((c.exp_mismatches for c in verdict.chunks), default=0)
            mant = max((c.mant_err_mean for c in verdict.chunks), default=0.0)
            gap = float(gaps[i].max())
            lp = float((torch.tensor(r.output_logprobs) - logprobs[i]).abs().max())
            honest["rows"] += 1
            honest["exp"], honest["mant"] = max(honest["exp"], exp), max(honest["mant"], mant)
            honest["gap"], honest["logprob"] = max(honest["gap"], gap), max(honest["logprob"], lp)
            far = (any(th.far_chunk(c.exp_mismatches, c.mant_err_mean) for c in verdict.chunks)
                   or gap >= th.row_far_factor * th.sampling_max_gap or lp >= th.row_far_factor * th.logprob_tolerance)  # fmt: skip
            honest["far rows"] += int(far)
        for a in range(len(rows)):
            for b in range(len(rows)):
                if a == b or len(rows[a].proofs) != len(rows[b].proofs) or not rows[a].proofs:
                    continue
                if rows[a].output_tokens == rows[b].output_tokens:
                    same += 1  # the same tokens make the same proof: not another row's
                    continue
                [v] = verify_proofs_batch([result[a].hidden], [rows[b].proofs], loose)
                pairs += 1
                reached += int(any(th.far_chunk(c.exp_mismatches, c.mant_err_mean) for c in v.chunks))
    honest["mant"], honest["gap"], honest["logprob"] = (round(honest[k], 4) for k in ("mant", "gap", "logprob"))
    return {"honest (tiny)": honest, "swapped proofs": {"pairs": pairs, "far": reached,
            "share far": round(reached / max(1, pairs), 4), "identical rows skipped": same}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=8, help="honest tiny files of 16 rows")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    report = {"records": record_margins(),
              **measure(tiny_files(args.files, Path(tempfile.mkdtemp(prefix="far-rows-"))))}  # fmt: skip
    out = ROOT / "bench" / "out" / "far_rows.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"{'record':<10} {'statistic':<28} {'far level':>10} {'worst honest':>13} {'margin':>7}")
    for r in report["records"]:
        print(f"{r['record']:<10} {r['statistic']:<28} {r['far level']:>10} {r['worst honest']:>13} {r['margin']:>6}x")
    h, s = report["honest (tiny)"], report["swapped proofs"]
    print(f"honest tiny rows: {h['rows']}, far: {h['far rows']} (worst: exponents {h['exp']}, mantissa mean "
          f"{h['mant']}, gap {h['gap']}, logprob {h['logprob']})")
    print(f"rows judged with another row's proofs: {s['far']} of {s['pairs']} far ({s['share far']:.1%}); "
          f"{s['identical rows skipped']} pairs of identical rows skipped")


if __name__ == "__main__":
    main()
