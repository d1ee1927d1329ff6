"""The hardware challenge (intellect/hardware.py, docs/hardware.md): what it costs each side, whether an
honest node on a busy machine ever fails it, how each kind of liar fares, and what it costs per node
per hour. Everything runs the protocol's own functions in process (no network: round trips are
simulated where said so).

1. Verifier against prover, per challenge, at `--sizes` (256, 1024, 2048) in float32 and at the
   middle size in bfloat16: the prover's time is `matrices` + `multiply` (numpy on this CPU) +
   `merkle_levels` + `answer`; the verifier's is `matrices` (the challenger builds A and B too,
   reported apart: it runs while the node computes) + `check` (with drawing the probe). Each part's
   best of 3 runs (time.perf_counter), the totals their sums, and the CPU seconds (time.process_time)
   of the fastest run. Ratio prover / verifier without and with the verifier's matrices.
2. Honest false rejects on a busy machine: `os.cpu_count()` processes spin (`while True`) beside
   `--challenges` honest challenges, sizes drawn in [1, 256] (1 in 5 in 1..8), the precision drawn
   among `PRECISIONS`. Counts the rejects (the protocol needs 0) and the largest `worst` (error over
   tolerance; the margin is 1 / worst). Run once as launched, then for each of `--threads` (1, 2) in a
   child process whose BLAS is limited by OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS
   (read when numpy loads, so only a fresh process can change them; each count is confirmed by the
   child's thread count in /proc where there is one). The same seed, so the same challenges, in each
   run. The spinners are stopped on every exit (try/finally; SIGTERM becomes an exit; a spinner whose
   parent is gone stops by itself).
3. Liars, `--trials` each at n = 128 float32 (caught = `check` refuses; every liar answers the probe
   consistently with what it committed to, its best play):
   a. wrong C: the honest C with one random entry moved by 1e-2 of that entry's scale
      (Σₖ|Aᵢₖ||Bₖⱼ|, the sum of its terms' sizes), and a C of random garbage; plus a sweep of the moved
      entry's size (1e-3 … 1e-6), showing where Freivalds stops seeing one entry alone and only an
      opened row does;
   b. replay: the product of another challenge's matrices (another id for this node, or this id for
      another node);
   c. cheap answer: commits to garbage, answers C·r with A·(B·r) (O(n²), right by Freivalds) and opens
      the garbage rows; also opening the true rows (computed after the probe) under the garbage tree;
   d. partly computed: a fraction f (0.5, 0.75, 0.9) of C's rows right, garbage elsewhere, C·r right:
      the pass rate measured against the exact bound (hypergeometric: none of the 64 opened rows is a
      garbage row) and f⁶⁴;
   e. claims 10× its FLOP/s: the commitment carries the node's own `seconds`, which nothing uses; the
      proven figure is 2n³ over the challenger's time from sending the challenge to receiving the
      commitment, nothing subtracted. With the prover times of 1. and a simulated link of 0, 10, 50 ms,
      the proven figure is the node's own over its commit time plus one round trip. A node that delays
      the round-trip probes by D gains nothing now; beside it, what issue 38's challenger (the probed
      round trip taken off, at most half the time) gave it: up to 2×;
   f. relays to a faster helper: the helper computes the true product, so no check can tell; only the
      time bound limits what the relay gains. Simulated: a helper k× faster (10, 100, 1000) 1 ms from
      the node, the node 10 ms from the challenger; proven over the node's own figure, now and before
      (with the probes delayed);
   g. lower precision: A and B computed in bfloat16 (or float16), passed off as float32.
4. Traffic and CPU per node per hour at the default schedule (`hardware_n` 1024, float32, one
   challenge before the invite, then re-challenges with a mean interval of `hardware_recheck_seconds`
   = 3600 s, i.e. one per hour): the four JSON bodies as the pydantic models of intellect/wire/hardware.py
   serialise them (dummy signatures of the right length) and the signed-request headers of the two
   requests (HTTP framing and the three `/health` pings not counted); the CPU seconds of prover and
   verifier at n = 1024 from 1.

    .venv/bin/python bench/hardware.py [--quick] [--json]
    OMP_NUM_THREADS=1 .venv/bin/python bench/hardware.py      # the prover and verifier on one thread

`--quick` (a smoke run): sizes 128/256/512, 100 honest challenges, 50 trials per liar. Progress goes
to stderr; `--json` prints only the figures, as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.hardware_liars import (  # noqa: E402
    LIAR_N,
    cheap,
    cheap_true_rows,
    garbage_c,
    hypergeometric,
    ids,
    lower_precision,
    moved_entry,
    other_challenge,
    other_node,
    partial,
    trial_run,
)
from intellect import hardware  # noqa: E402
from intellect.hardware import PRECISIONS, ROWS_OPENED  # noqa: E402
from intellect.signing import HEADER_ADDRESS, HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP  # noqa: E402
from intellect.wire.hardware import (  # noqa: E402
    HardwareAnswer,
    HardwareChallenge,
    HardwareCommitment,
    HardwareReveal,
)

DUMMY_SIGNATURE = "0x" + "00" * 65
DEFAULT_N, DEFAULT_PRECISION, RECHECK_SECONDS = 1024, "float32", 3600.0  # orchestrator/settings.py
BLAS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- 1. verifier against prover ----------------------------------------------------------------------


def timing(n: int, precision: str, repeats: int, rng: np.random.Generator) -> dict[str, Any]:
    best: dict[str, Any] | None = None
    parts = {"matrices": math.inf, "multiply": math.inf, "merkle": math.inf, "answer": math.inf,
             "v_matrices": math.inf, "check": math.inf}  # fmt: skip
    for _ in range(repeats):
        challenge_id, node, secret = ids(rng)
        cpu0, t0 = time.process_time(), time.perf_counter()
        a, b = hardware.matrices(challenge_id, node, n, precision)
        t1 = time.perf_counter()
        c = hardware.multiply(a, b, precision)
        t2 = time.perf_counter()
        levels = hardware.merkle_levels(c)
        t3 = time.perf_counter()
        p = hardware.probe(secret, n)
        cr, rows, proofs = hardware.answer(c, levels, p)
        t4, cpu1 = time.perf_counter(), time.process_time()
        va, vb = hardware.matrices(challenge_id, node, n, precision)
        t5 = time.perf_counter()
        vp = hardware.probe(secret, n)
        result = hardware.check(va, vb, precision, levels[-1][0].hex(), vp, cr, rows, proofs)
        t6, cpu2 = time.perf_counter(), time.process_time()
        if not result.ok:
            raise RuntimeError(f"honest answer refused at n={n} {precision}: {result.reasons[:2]}")
        for key, seconds in (("matrices", t1 - t0), ("multiply", t2 - t1), ("merkle", t3 - t2),
                             ("answer", t4 - t3), ("v_matrices", t5 - t4), ("check", t6 - t5)):  # fmt: skip
            parts[key] = min(parts[key], seconds)
        run = {"prover_s": t4 - t0, "commit_s": t3 - t0, "verifier_s": t6 - t4, "prover_cpu_s": cpu1 - cpu0,
               "verifier_cpu_s": cpu2 - cpu1, "worst": result.worst,
               "reveal": (challenge_id, node, levels[-1][0].hex(), cr, rows, proofs)}  # fmt: skip
        if best is None or run["prover_s"] + run["verifier_s"] < best["prover_s"] + best["verifier_s"]:
            best = run
    assert best is not None
    prover = parts["matrices"] + parts["multiply"] + parts["merkle"] + parts["answer"]
    verifier = parts["v_matrices"] + parts["check"]
    return {
        "n": n, "precision": precision,
        "prover_ms": {"matrices": parts["matrices"] * 1e3, "multiply": parts["multiply"] * 1e3,
                      "merkle": parts["merkle"] * 1e3, "answer": parts["answer"] * 1e3, "total": prover * 1e3,
                      "commit": (parts["matrices"] + parts["multiply"] + parts["merkle"]) * 1e3},
        "verifier_ms": {"matrices": parts["v_matrices"] * 1e3, "check": parts["check"] * 1e3,
                        "total": verifier * 1e3},
        "ratio_without_matrices": prover / parts["check"], "ratio_with_matrices": prover / verifier,
        "prover_cpu_s": best["prover_cpu_s"], "verifier_cpu_s": best["verifier_cpu_s"],
        "multiply_gflops": 2 * n**3 / parts["multiply"] / 1e9, "worst": best["worst"],
        "_reveal": best["reveal"],
    }  # fmt: skip


# --- 2. honest answers beside busy neighbours -----------------------------------------------------------


def _spin(parent: int) -> None:
    """A busy neighbour: spins until terminated (or its parent is gone)."""
    while True:
        for _ in range(1_000_000):
            pass
        if os.getppid() != parent:
            return


def start_spinners(procs: list[multiprocessing.process.BaseProcess], count: int) -> None:
    for _ in range(count):
        proc = multiprocessing.Process(target=_spin, args=(os.getpid(),), daemon=True)
        proc.start()
        procs.append(proc)


def stop_spinners(procs: list[multiprocessing.process.BaseProcess]) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def os_threads() -> int | None:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def honest_run(count: int, seed: int, max_n: int = 256) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    rejects: list[dict[str, Any]] = []
    worst = {p: 0.0 for p in PRECISIONS}
    counts = {p: 0 for p in PRECISIONS}
    worst_case: dict[str, Any] = {}
    tiny = 0
    started = time.perf_counter()
    for _ in range(count):
        n = int(rng.integers(1, 9)) if rng.random() < 0.2 else int(rng.integers(1, max_n + 1))
        precision = PRECISIONS[int(rng.integers(len(PRECISIONS)))]
        challenge_id, node, secret = ids(rng)
        tiny += n <= 8
        a, b = hardware.matrices(challenge_id, node, n, precision)  # the same A, B on both sides
        c = hardware.multiply(a, b, precision)
        levels = hardware.merkle_levels(c)
        p = hardware.probe(secret, n)
        result = hardware.check(a, b, precision, levels[-1][0].hex(), p, *hardware.answer(c, levels, p))
        counts[precision] += 1
        if not result.ok:
            rejects.append({"challenge_id": challenge_id, "node": node, "secret": secret.hex(), "n": n,
                            "precision": precision, "reasons": result.reasons[:2]})  # fmt: skip
        if result.worst > worst[precision]:
            worst[precision] = result.worst
        if result.worst > worst_case.get("worst", -1.0):
            worst_case = {"worst": result.worst, "n": n, "precision": precision}
    top = max(worst.values())
    return {"challenges": count, "tiny": tiny, "rejects": len(rejects), "reject_examples": rejects[:3],
            "worst": top, "margin": 1 / top if top else None, "worst_case": worst_case,
            "worst_by_precision": worst, "by_precision": counts, "seconds": time.perf_counter() - started,
            "os_threads": os_threads(), "blas_env": {k: os.environ.get(k) for k in BLAS_ENV}}  # fmt: skip


def honest_child(count: int, seed: int, threads: int) -> dict[str, Any]:
    env = dict(os.environ, **{k: str(threads) for k in BLAS_ENV})
    cmd = [sys.executable, str(Path(__file__).resolve()), "--honest-only", "--challenges", str(count),
           "--seed", str(seed)]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"honest run with {threads} BLAS threads failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def flops_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The proven figure as the challenger computes it (orchestrator/hardware/challenger.py: 2n³ over the
    exchange on its clock, nothing subtracted), from the prover's measured commit time and a simulated
    round trip; `before` is issue 38's challenger (the probed round trip taken off, at most half)."""

    def proven(n: int, elapsed: float, measured_rtt: float | None = None) -> float:
        if measured_rtt is None:
            return hardware.proven_flops(n, elapsed) / 1e9
        return hardware.proven_flops(n, elapsed - min(measured_rtt, elapsed / 2)) / 1e9

    table = []
    for row in rows:
        n, t = row["n"], row["prover_ms"]["commit"] / 1e3
        own = proven(n, t + 0.010)  # its own speed seen through a 10 ms link
        # a relay to a helper k× faster, 1 ms away, probes delayed (D ≥ the elapsed time) or not
        relay = {f"{k}x": {"now": proven(n, t / k + 0.001 + 0.010) / own,
                           "before_delayed": proven(n, t / k + 0.011, 1.0) / own}
                 for k in (10, 100, 1000)}  # fmt: skip
        table.append({
            "n": n, "precision": row["precision"], "commit_ms": t * 1e3,
            "multiply_gflops": row["multiply_gflops"],
            "proven_gflops": {str(ms): proven(n, t + ms / 1e3) for ms in (0, 10, 50)},
            "claimed_10x_gflops": 10 * hardware.proven_flops(n, t) / 1e9,
            "health_delayed_gflops": {f"{share:g}": proven(n, t + 0.010) for share in (0.5, 0.9, 1.0)},
            "health_delayed_before_gflops": {f"{share:g}": proven(n, t + 0.010, 0.010 + share * t)
                                             for share in (0.5, 0.9, 1.0)},
            "relay_factor": relay,
        })  # fmt: skip
    return table


# --- 4. traffic and CPU per node per hour ---------------------------------------------------------------


def traffic(row: dict[str, Any]) -> dict[str, Any]:
    challenge_id, node, root, cr, rows, proofs = row["_reveal"]
    challenge = HardwareChallenge(challenge_id=challenge_id, n=row["n"], precision=row["precision"])
    commitment = HardwareCommitment(challenge_id=challenge_id, node_address=node, root=root,
                                    seconds=round(row["prover_ms"]["commit"] / 1e3, 6),
                                    signature=DUMMY_SIGNATURE)  # fmt: skip
    reveal = HardwareReveal(challenge_id=challenge_id, secret="ab" * 32)
    answer = HardwareAnswer(challenge_id=challenge_id, cr=cr, rows=rows, proofs=proofs,
                            signature=DUMMY_SIGNATURE)  # fmt: skip
    bodies = {name: len(model.model_dump_json().encode())
              for name, model in (("challenge", challenge), ("commitment", commitment), ("reveal", reveal),
                                  ("answer", answer))}  # fmt: skip
    signed = {HEADER_ADDRESS: "0x" + "ab" * 20, HEADER_SIGNATURE: DUMMY_SIGNATURE, HEADER_TIMESTAMP: "1" * 10,
              HEADER_NONCE: "cd" * 16}  # fmt: skip
    headers = 2 * sum(len(f"{k}: {v}\r\n") for k, v in signed.items())  # on the two requests
    per_challenge = sum(bodies.values()) + headers
    per_hour = 3600.0 / RECHECK_SECONDS
    return {
        "n": row["n"], "precision": row["precision"], "bodies_bytes": bodies, "signed_headers_bytes": headers,
        "bytes_per_challenge": per_challenge, "challenges_per_hour": per_hour,
        "bytes_per_node_hour": per_challenge * per_hour,
        "prover_cpu_s_per_challenge": row["prover_cpu_s"],
        "verifier_cpu_s_per_challenge": row["verifier_cpu_s"],
        "prover_cpu_s_per_node_hour": row["prover_cpu_s"] * per_hour,
        "verifier_cpu_s_per_node_hour": row["verifier_cpu_s"] * per_hour,
    }  # fmt: skip


# --- the report ----------------------------------------------------------------------------------------


RELAY = ("the helper computes the true product, so no check tells it apart; only the time bound limits "
         "what a relay gains: the relayed answer proves the helper's speed less the relay's delay.")


def report(f: dict[str, Any]) -> None:
    cfg = f["config"]
    blas = {k: v for k, v in cfg["blas_env"].items() if v is not None} or "unset"
    print(f"hardware challenge bench: {cfg['cpu_count']} CPUs, BLAS env {blas}, seed {cfg['seed']}")
    print("\n1. prover vs verifier per challenge (ms, best of 3)")
    print(f"  {'n':>5} {'precision':>9} | {'A,B':>7} {'A·B':>8} {'merkle':>7} {'answer':>7} {'prover':>8} | "
          f"{'A,B':>7} {'check':>7} {'verif.':>7} | {'p/check':>7} {'p/verif':>7} | {'GFLOP/s':>7} "
          f"{'cpu p/v s':>11} {'worst':>7}")
    for r in f["timing"]:
        p, v = r["prover_ms"], r["verifier_ms"]
        print(f"  {r['n']:>5} {r['precision']:>9} | {p['matrices']:7.2f} {p['multiply']:8.2f} "
              f"{p['merkle']:7.2f} {p['answer']:7.2f} {p['total']:8.2f} | {v['matrices']:7.2f} "
              f"{v['check']:7.2f} {v['total']:7.2f} | {r['ratio_without_matrices']:7.1f} "
              f"{r['ratio_with_matrices']:7.1f} | {r['multiply_gflops']:7.1f} "
              f"{r['prover_cpu_s']:5.3f}/{r['verifier_cpu_s']:5.3f} {r['worst']:7.4f}")
    print("  (the verifier's A,B runs while the node computes: p/check leaves it out, p/verif counts it)")

    print("\n2. honest answers beside busy neighbours "
          f"({cfg['spinners']} spinning processes; sizes 1..256, 1 in 5 in 1..8; every precision)")
    for h in f["honest"]:
        wp = ", ".join(f"{k} {v:.4f}" for k, v in h["worst_by_precision"].items())
        wc = h["worst_case"]
        print(f"  BLAS threads {h['threads']}: {h['rejects']} rejected of {h['challenges']} ({h['tiny']} "
              f"with n ≤ 8), {h['seconds']:.1f} s, {h['os_threads']} OS threads\n"
              f"    worst {h['worst']:.4f} of the tolerance (margin {h['margin'] or math.inf:.1f}×, "
              f"at n={wc.get('n')} {wc.get('precision')}); by precision: {wp}")
        for example in h["reject_examples"]:
            print(f"    REJECTED: {example}")
    if f["threads_note"]:
        print(f"  {f['threads_note']}")

    li = f["liars"]
    print(f"\n3. liars at n={li['n']} float32, caught / trials")

    def line(label: str, r: dict[str, Any]) -> None:
        by = ", ".join(f"{k} {v}" for k, v in r["by"].items() if v)
        least = r["least_worst_caught"]
        least = "" if least is None else f"; least {least:.3g}× the tolerance"
        print(f"  {label:<60} {r['caught']:>4}/{r['trials']}" + (f" ({by}{least})" if by else ""))

    line("a. one entry moved by 1e-2 of its scale", li["wrong_entry"])
    line("a. garbage C", li["garbage"])
    for s in li["entry_sweep"]:
        line(f"   sweep: one entry moved by {s['relative']:g} of its scale", s)
    line("b. replay: another challenge's product (this node)", li["other_challenge"])
    line("b. replay: this challenge's product for another node", li["other_node"])
    line("c. cheap: garbage committed, C·r = A·(B·r), garbage rows", li["cheap"])
    line("c. cheap: garbage committed, C·r = A·(B·r), true rows opened", li["cheap_true_rows"])
    print(f"  d. partly computed (C·r right; passes only if no opened row is garbage, {ROWS_OPENED} opened):")
    for d in li["partial"]:
        print(f"     f = {d['f']:<4} ({d['right_rows']:>3} of {li['n']} rows right): passed {d['passed']:>3}/"
              f"{d['trials']} = {d['rate']:.4f}; bound {d['hypergeometric']:.4f} (hypergeometric), "
              f"f^{ROWS_OPENED} {d['f8']:.4f}")
    print("  e. claims 10× its FLOP/s: the proven figure is 2n³ / (the challenger's time, round trip in)")
    print(f"     {'n':>5} {'commit ms':>9} {'A·B alone':>9} | {'proven at rtt 0/10/50 ms':>26} | "
          f"{'claimed':>8}")
    for e in li["flops"]:
        proven = " / ".join(f"{v:.2f}" for v in e["proven_gflops"].values())
        print(f"     {e['n']:>5} {e['commit_ms']:9.2f} {e['multiply_gflops']:9.2f} | {proven:>26} | "
              f"{e['claimed_10x_gflops']:8.2f}   (GFLOP/s)")
    print("     the claim (the commitment's own `seconds` ÷ 10) is ignored. A node that delays the")
    print("     round-trip probes by D (a share of its commit time t, true rtt 10 ms) proves, now and")
    print("     before (GFLOP/s):")
    for e in li["flops"]:
        now = ", ".join(f"D = {k}·t: {v:.3g}" for k, v in e["health_delayed_gflops"].items())
        before = ", ".join(f"{v:.3g}" for v in e["health_delayed_before_gflops"].values())
        print(f"     {e['n']:>5}: {now}   (before: {before})")
    print("  f. relays to a helper k× faster, 1 ms away, link 10 ms: proven ÷ its own figure, now / before")
    print("     (before: with the probes delayed)")
    for e in li["flops"]:
        shown = ", ".join(f"{k}: {v['now']:.1f}× / {v['before_delayed']:.1f}×"
                          for k, v in e["relay_factor"].items())  # fmt: skip
        print(f"     {e['n']:>5}: {shown}")
    print(f"     {RELAY}")
    for g in li["lower_precision"]:
        line(f"g. computed in {g['precision']}, passed off as float32", g)

    t = f["traffic"]
    b = t["bodies_bytes"]
    print(f"\n4. traffic and CPU per node per hour (n={t['n']} {t['precision']}, "
          f"{t['challenges_per_hour']:g} challenge an hour on average, plus one at the invite)")
    print(f"  bodies: challenge {b['challenge']} B, commitment {b['commitment']} B, reveal {b['reveal']} B, "
          f"answer {b['answer']} B; signed headers {t['signed_headers_bytes']} B")
    print(f"  per challenge {t['bytes_per_challenge'] / 1e3:.1f} kB; per node-hour "
          f"{t['bytes_per_node_hour'] / 1e3:.1f} kB; node CPU {t['prover_cpu_s_per_node_hour']:.3f} s/h, "
          "challenger CPU "
          f"{t['verifier_cpu_s_per_node_hour']:.3f} s/h per node")
    print(f"\nruntime {f['seconds']:.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="n of part 1 (256 1024 2048)")
    parser.add_argument("--challenges", type=int, default=None, help="honest challenges (1000)")
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2],
                        help="BLAS thread counts for the honest run's child processes (none: skip)")
    parser.add_argument("--trials", type=int, default=None, help="trials per liar (200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="sizes 128 256 512, 100 challenges, 50 trials")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--honest-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = args.sizes or ([128, 256, 512] if args.quick else [256, 1024, 2048])
    challenges = args.challenges or (100 if args.quick else 1000)
    trials = args.trials or (50 if args.quick else 200)
    if args.honest_only:  # a child of part 2, its BLAS threads set by its environment
        print(json.dumps(honest_run(challenges, args.seed)))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the spinners' finally runs
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    launched = next((f"{k}={os.environ[k]}" for k in BLAS_ENV if k in os.environ), "unset")

    log("1. prover vs verifier")
    cases = [(n, "float32") for n in sizes] + [(sorted(sizes)[len(sizes) // 2], "bfloat16")]
    rows = []
    for n, precision in cases:
        rows.append(timing(n, precision, 3, rng))
        log(f"  n={n} {precision}: prover {rows[-1]['prover_ms']['total']:.1f} ms, "
            f"verifier {rows[-1]['verifier_ms']['total']:.1f} ms")
    default = next((r for r in rows if (r["n"], r["precision"]) == (DEFAULT_N, DEFAULT_PRECISION)), None)
    if default is None:
        default = timing(DEFAULT_N, DEFAULT_PRECISION, 1 if args.quick else 3, rng)

    spinners = os.cpu_count() or 1
    log(f"2. {challenges} honest challenges beside {spinners} spinning processes")
    honest = []
    procs: list[multiprocessing.process.BaseProcess] = []
    try:
        start_spinners(procs, spinners)
        run = honest_run(challenges, args.seed)
        honest.append({"threads": f"as launched ({launched})", **run})
        log(f"  as launched: {run['rejects']} rejects, worst {run['worst']:.4f}, {run['seconds']:.1f} s")
        for threads in args.threads:
            run = honest_child(challenges, args.seed, threads)
            honest.append({"threads": str(threads), **run})
            log(f"  {threads} BLAS threads: {run['rejects']} rejects, worst {run['worst']:.4f}, "
                f"{run['seconds']:.1f} s")
    finally:
        stop_spinners(procs)
    threads_note = "" if args.threads else "BLAS thread counts not varied (--threads given none)"

    log(f"3. liars, {trials} trials each at n={LIAR_N}")
    liars: dict[str, Any] = {"n": LIAR_N, "trials": trials}
    liars["wrong_entry"] = trial_run(moved_entry(1e-2), trials, rng)
    liars["garbage"] = trial_run(garbage_c, trials, rng)
    liars["entry_sweep"] = [{"relative": rel, **trial_run(moved_entry(rel), trials, rng)}
                            for rel in (1e-3, 1e-4, 1e-5, 1e-6)]  # fmt: skip
    liars["other_challenge"] = trial_run(other_challenge, trials, rng)
    liars["other_node"] = trial_run(other_node, trials, rng)
    liars["cheap"] = trial_run(cheap, trials, rng)
    liars["cheap_true_rows"] = trial_run(cheap_true_rows, trials, rng)
    liars["partial"] = []
    for fraction in (0.5, 0.75, 0.9):
        r = trial_run(partial(fraction), trials, rng)
        right = round(fraction * LIAR_N)
        liars["partial"].append({"f": fraction, "right_rows": right, "trials": trials,
                                 "passed": trials - r["caught"], "rate": (trials - r["caught"]) / trials,
                                 "hypergeometric": hypergeometric(right, LIAR_N),
                                 "f8": fraction**ROWS_OPENED})  # fmt: skip
    liars["flops"] = flops_table([r for r in rows if r["precision"] == "float32"])
    liars["relay"] = RELAY
    liars["lower_precision"] = [{"precision": p, **trial_run(lower_precision(p), trials, rng)}
                                for p in ("bfloat16", "float16")]  # fmt: skip

    log("4. traffic")
    figures = {
        "config": {"sizes": sizes, "challenges": challenges, "threads": args.threads, "trials": trials,
                   "seed": args.seed, "cpu_count": os.cpu_count(), "spinners": spinners,
                   "blas_env": {k: os.environ.get(k) for k in BLAS_ENV}, "quick": args.quick},
        "timing": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
        "honest": honest, "threads_note": threads_note, "liars": liars, "traffic": traffic(default),
    }  # fmt: skip
    figures["seconds"] = time.perf_counter() - started
    if args.json:
        print(json.dumps(figures, indent=1))
    else:
        report(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
