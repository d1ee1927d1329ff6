"""`make devnet` N times back to back next to a busy neighbour: does any honest node lose pay or stake?

Issue 37: one `make devnet` with other work on the same two cores voted an honest node's file invalid
for one row past a logprob limit; its stake went. This bench repeats the main command (`intellect
devnet up --demo`, 40 steps, three validators, a 2-of-3 quorum, a cheater) while busy processes
share the cores, and counts per run what the protocol promises never happens:

- honest invalidations (a validator voted `invalidate` on an honest node's file),
- honest files not paid (`soft_invalidate`), with their reasons (not a slash, but counted; the last
  steps' files judged after the trainer had stopped serving their checkpoints were among them until
  the trainer kept serving them for their vote window: docs/trainer.md, "Checkpoints kept for the
  judges"),
- honest nodes slashed or out of the pool at the end,
- and, for scale, files judged, whether the cheater was ejected, the run's wall time.

The busy neighbour is `--busy` processes each multiplying 384x384 float32 matrices in a loop on one
BLAS thread (cores and memory bandwidth taken, as another user's job would); the machine's load is
sampled every 10 s. Every honest file that was not accepted is copied with its verdicts to
`--out`/<run>/ (kept as test data, like tests/workloads/judge/data/demo-near-tie). The summary is JSON on
stdout and in `--out`/summary.json.

    .venv/bin/python bench/devnet_soak.py --runs 10             # ~15 min a run next to 2 busy loops
    .venv/bin/python bench/devnet_soak.py --runs 1 --steps 10 --busy 0   # ~4 min (devnet_soak_end.json)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / ".venv" / "bin"


def busy_loop() -> None:  # pragma: no cover - runs in a child until killed
    os.environ["OMP_NUM_THREADS"] = "1"
    import numpy as np  # noqa: PLC0415

    a = np.random.default_rng(0).standard_normal((384, 384), dtype=np.float32)
    while True:
        a = np.tanh(a @ a.T / 384.0)


def all_verdicts(url: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    after = 0
    while True:
        page = httpx.get(f"{url}/verdicts", params={"after": after, "limit": 1000}, timeout=30).json()
        if not page.get("items"):
            return items
        items.extend(page["items"])
        after = page["items"][-1]["cursor"]


def parquet_by_sha(root: Path, wanted: set[str]) -> dict[str, Path]:
    """The devnet's copies of the wanted files (workers' outputs, the orchestrator's storage)."""
    found: dict[str, Path] = {}
    for path in root.rglob("*"):
        if len(found) == len(wanted):
            break
        if not path.is_file() or path.stat().st_size > 64 * 1024 * 1024:
            continue
        if path.suffix != ".parquet" and not any(w in path.name for w in wanted):
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest in wanted and digest not in found:
            found[digest] = path
    return found


def one_run(index: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix=f"soak{index}-", dir="/tmp"))
    cmd = [str(BIN / "intellect"), "devnet", "up", "--demo", "--json", "--dir", str(run_dir),
           "--steps", str(args.steps), "--timeout", str(args.timeout)]  # fmt: skip
    started = time.monotonic()
    loads: list[float] = []
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None:
        loads.append(os.getloadavg()[0])
        time.sleep(10)
    stdout, stderr = proc.communicate()
    wall = time.monotonic() - started
    report: dict[str, Any] = {}
    start = 0 if stdout.startswith("{") else stdout.find("\n{") + 1
    if start > 0 or stdout.startswith("{"):
        try:
            report = json.loads(stdout[start:])
        except json.JSONDecodeError:
            report = {}
    result: dict[str, Any] = {
        "run": index, "exit": proc.returncode, "wall_seconds": round(wall, 1),
        "load_mean": round(sum(loads) / len(loads), 2) if loads else None,
        "load_max": round(max(loads), 2) if loads else None,
        "steps": report.get("steps"), "files_judged": report.get("files_judged"),
        "files_accepted": report.get("files_accepted"), "cheater_ejected": report.get("cheater_ejected"),
        "honest_out_of_pool": report.get("honest_out_of_pool", {}),
    }  # fmt: skip
    if not report:
        result["stderr_tail"] = stderr[-3000:]
    # Every validator's verdicts on honest nodes' files, read before the devnet goes down.
    state = json.loads((run_dir / "devnet.json").read_text()) if (run_dir / "devnet.json").exists() else {}
    cheater = str(report.get("cheater", "")).lower()
    bad: list[dict[str, Any]] = []
    judged = 0
    for p in state.get("processes", []):
        if not p["name"].startswith("validator") or not p.get("url"):
            continue
        try:
            items = all_verdicts(p["url"])
        except (httpx.HTTPError, ValueError) as exc:
            result.setdefault("errors", []).append(f"{p['name']}: {exc!r}")
            continue
        for item in items:
            if item["node"].lower() == cheater:
                continue
            judged += 1
            if item["verdict"] != "accept":
                bad.append({"validator": p["name"], "node": item["node"], "work_key": item["work_key"],
                            "verdict": item["verdict"], "reasons": item.get("reasons", [])})  # fmt: skip
    result["honest_verdicts"] = judged
    result["honest_invalidate"] = sum(b["verdict"] == "invalidate" for b in bad)
    result["honest_soft_invalidate"] = sum(b["verdict"] == "soft_invalidate" for b in bad)
    result["honest_not_accepted"] = bad
    if bad:
        keep = out / f"run{index:02d}"
        keep.mkdir(parents=True, exist_ok=True)
        wanted = {b["work_key"].lower().removeprefix("0x") for b in bad}
        for digest, path in parquet_by_sha(run_dir, wanted).items():
            shutil.copy2(path, keep / f"{digest}.parquet")
        (keep / "verdicts.json").write_text(json.dumps(bad, indent=2))
        for log in run_dir.rglob("*.log"):  # the validators' and workers' own words about those files
            if log.name.startswith(("validator", "trainer", "worker")):
                shutil.copy2(log, keep / log.name)
    subprocess.run([str(BIN / "intellect"), "devnet", "down", "--dir", str(run_dir)], cwd=REPO,
                   capture_output=True, timeout=300)  # fmt: skip
    if not bad and not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        result["dir"] = str(run_dir)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40, help="trainer steps a run (make devnet: 40)")
    parser.add_argument("--busy", type=int, default=2, help="busy-loop processes next to the devnet")
    parser.add_argument("--timeout", type=float, default=3600.0, help="a run's demo timeout")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "devnet_soak")
    parser.add_argument("--keep", action="store_true", help="keep every run's devnet folder")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    neighbours = [multiprocessing.Process(target=busy_loop, daemon=True) for _ in range(args.busy)]
    for n in neighbours:
        n.start()
    runs: list[dict[str, Any]] = []
    try:
        for i in range(1, args.runs + 1):
            result = one_run(i, args, args.out)
            runs.append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "honest_not_accepted"}), flush=True)
            summary = {
                "runs": len(runs), "steps": args.steps, "busy": args.busy, "cores": os.cpu_count(),
                "honest_verdicts": sum(r["honest_verdicts"] for r in runs),
                "honest_invalidate": sum(r["honest_invalidate"] for r in runs),
                "honest_soft_invalidate": sum(r["honest_soft_invalidate"] for r in runs),
                "honest_out_of_pool": sum(len(r["honest_out_of_pool"] or {}) for r in runs),
                "cheater_ejected": sum(bool(r["cheater_ejected"]) for r in runs),
                "failed_runs": sum(r["exit"] != 0 for r in runs),
                "not_accepted_by_reason": dict(Counter(
                    f"{b['verdict']}: {(b['reasons'] or ['?'])[0][:70]}"
                    for r in runs for b in r["honest_not_accepted"]
                ).most_common()),
                "per_run": runs,
            }  # fmt: skip
            (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    finally:
        for n in neighbours:
            n.terminate()
    print(json.dumps({k: v for k, v in summary.items() if k != "per_run"}, indent=2))
    return 0 if summary["honest_invalidate"] == 0 and summary["honest_out_of_pool"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
