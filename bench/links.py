"""The delay relay's accuracy (intellect/links.py): requested vs measured one-way delay on loopback.

A 64-byte ping goes through the relay to an echo server and back (both directions held), many times
per setting; the one-way figure is (round trip through the relay − round trip direct) / 2, median and
95th percentile. Side by side, in one run, for 0, 10, 50 and 100 ms, and 50 ms with 10 ms of jitter.

    .venv/bin/python bench/links.py            # about 40 s
    .venv/bin/python bench/links.py --json
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from intellect.links import DelayRelay, LinkShape  # noqa: E402
from tests.support.loopback import echo_server  # noqa: E402


def pings(port: int, count: int) -> list[float]:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        took = []
        for _ in range(count):
            started = time.perf_counter()
            conn.sendall(b"x" * 64)
            got = 0
            while got < 64:
                got += len(conn.recv(64 - got))
            took.append(time.perf_counter() - started)
        return took


def p95(values: list[float]) -> float:
    return sorted(values)[int(0.95 * (len(values) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--count", type=int, default=100, help="pings per setting")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    server, port = echo_server()
    direct = pings(port, args.count)
    base = statistics.median(direct)
    rows = []
    for shape in (LinkShape(0.0), LinkShape(0.010), LinkShape(0.050), LinkShape(0.100),
                  LinkShape(0.050, jitter=0.010)):  # fmt: skip
        with DelayRelay(("127.0.0.1", port), shape) as relay:
            through = pings(relay.port, args.count)
        one_way = [(t - base) / 2 * 1e3 for t in through]
        expected = (shape.delay + shape.jitter / 2) * 1e3
        median = statistics.median(one_way)
        rows.append({"requested": str(shape), "expected_one_way_ms": round(expected, 3),
                     "median_one_way_ms": round(median, 3), "p95_one_way_ms": round(p95(one_way), 3),
                     "median_error_ms": round(median - expected, 3),
                     "ratio": round(median / expected, 4) if expected else None})  # fmt: skip
    server.close()
    result = {"direct_round_trip_ms": round(base * 1e3, 4), "pings": args.count, "links": rows}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"direct loopback round trip {base * 1e3:.3f} ms (median of {args.count})")
    print(f"{'requested':<24}{'expected':>10}{'median':>10}{'p95':>10}{'error':>10}{'ratio':>8}")
    for r in rows:
        ratio = f"{r['ratio']:.3f}" if r["ratio"] else "-"
        print(f"{r['requested']:<24}{r['expected_one_way_ms']:>10.3f}{r['median_one_way_ms']:>10.3f}"
              f"{r['p95_one_way_ms']:>10.3f}{r['median_error_ms']:>10.3f}{ratio:>8}")


if __name__ == "__main__":
    main()
