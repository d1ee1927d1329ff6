"""The pipeline fuzzer's long run (issue 55): N cases of one member of a 2- or 3-member group changing
one field of one frame it sends, every member judged as the validator judges it.

    .venv/bin/python bench/pipeline_fuzz.py --cases 400 [--seed 7] [--json]

Prints the cases tried, how they ended (the batch stopped naming the sender, or files written and
their verdicts) and every property failure (an honest member's file invalidated; a changed batch paid).
Writes bench/out/pipeline_fuzz.json with --json."""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

from workloads.pipeline.adversary import Fuzzer

OUT = Path(__file__).resolve().parent / "out" / "pipeline_fuzz.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help=f"also write {OUT}")
    args = parser.parse_args()
    started = time.perf_counter()
    fuzzer = Fuzzer()
    cases = fuzzer.run(args.cases, seed=args.seed)
    seconds = time.perf_counter() - started
    outcomes = collections.Counter(
        "stopped, nothing written" if c.stopped and not c.verdicts else
        "+".join(sorted(set(c.verdicts.values()))) + (" (after a stop)" if c.stopped else "")
        for c in cases)  # fmt: skip
    kinds = collections.Counter(str(c.mutation).split(":")[0] for c in cases)
    misnamed = [str(c) for c in cases if any(n not in (c.index, None) for n in c.named.values())]
    failures = [f"{c}: {c.failures}" for c in cases if c.failures]
    within = [f"{c}: {c.within}" for c in cases if c.within]
    print(f"{len(cases)} cases in {seconds:.0f} s (seed {args.seed}); mutations by kind: {dict(kinds)}")
    for outcome, count in outcomes.most_common():
        print(f"  {count:5d}  {outcome}")
    print(f"honest members naming an honest member on a frame: {len(misnamed)}")
    print(f"changed tokens paid with the adversary's own file clean (inside the tolerance): {len(within)}")
    print(f"property failures: {len(failures)}")
    for line in failures + within + misnamed[:20]:
        print("  " + line)
    if args.json:
        OUT.parent.mkdir(exist_ok=True)
        OUT.write_text(json.dumps({"cases": len(cases), "seed": args.seed, "seconds": round(seconds, 1),
                                   "kinds": kinds, "outcomes": outcomes, "misnamed": misnamed,
                                   "within_tolerance": within, "failures": failures}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
