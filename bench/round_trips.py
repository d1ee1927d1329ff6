"""What measuring round trips costs a node (orchestrator/hardware/round_trips.py), at the default
schedule: one `POST /hardware/round-trips` every `round_trip_seconds` (300 s) naming 16 peer inboxes,
each measured by 3 TCP handshakes. Measured here: the worker's CPU time for one request's 48
handshakes (to 16 real listeners on loopback, `worker.heartbeat.handshake_ms`, as the route runs them)
and the request and reply bodies (the wire models). Per hour: × 12. The packets of the handshakes are
counted, not captured (this machine has no packet capture): a connect and a close are 7 TCP
segments of 52-60 bytes at the IP layer on Linux (SYN, SYN-ACK, ACK, FIN, ACK, FIN, ACK).

    .venv/bin/python bench/round_trips.py [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from intellect.wire.hardware import MAX_PEERS, RoundTripReport, RoundTripRequest  # noqa: E402
from worker.heartbeat import handshake_ms  # noqa: E402

PASS_SECONDS = 300.0  # OrchestratorSettings.round_trip_seconds
SEGMENTS_PER_PROBE, SEGMENT_BYTES = 7, 56
SIGNED_HEADERS = 400  # the request's signature, address, timestamp and nonce headers, about


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=20, help="requests to time (median reported)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    listeners = [socket.create_server(("127.0.0.1", 0), backlog=64) for _ in range(MAX_PEERS)]
    peers = [f"127.0.0.1:{s.getsockname()[1]}" for s in listeners]

    async def one_request() -> tuple[float, float, list[float | None]]:
        cpu, wall = time.process_time(), time.perf_counter()
        ms = list(await asyncio.gather(*(handshake_ms(p, timeout=2.0) for p in peers)))
        return time.process_time() - cpu, time.perf_counter() - wall, ms

    async def run() -> list[tuple[float, float, list[float | None]]]:
        done = []
        for _ in range(args.passes):
            done.append(await one_request())
            for s in listeners:  # accept what the handshakes left in the backlog
                s.setblocking(False)
                try:
                    while True:
                        s.accept()[0].close()
                except BlockingIOError:
                    pass
        return done

    results = asyncio.run(run())
    for s in listeners:
        s.close()
    cpu = sorted(r[0] for r in results)[len(results) // 2]
    wall = sorted(r[1] for r in results)[len(results) // 2]
    request = len(RoundTripRequest(peers=[f"10.88.1.{i}:7000" for i in range(MAX_PEERS)]).model_dump_json())
    reply = len(RoundTripReport(ms=results[-1][2]).model_dump_json())
    per_hour = 3600.0 / PASS_SECONDS
    probes = 3 * MAX_PEERS
    out = {
        "peers_per_request": MAX_PEERS, "handshakes_per_request": probes,
        "worker_cpu_s_per_request": cpu, "wall_s_per_request_loopback": wall,
        "request_body_bytes": request, "reply_body_bytes": reply,
        "handshake_bytes_per_request_counted": probes * SEGMENTS_PER_PROBE * SEGMENT_BYTES,
        "requests_per_hour": per_hour,
        "worker_cpu_s_per_hour": cpu * per_hour,
        "bytes_per_node_hour": per_hour * (request + SIGNED_HEADERS + reply
                                           + probes * SEGMENTS_PER_PROBE * SEGMENT_BYTES),  # fmt: skip
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"one request: {MAX_PEERS} peers, {probes} handshakes; worker CPU {cpu * 1e3:.1f} ms, wall "
          f"{wall * 1e3:.1f} ms on loopback; bodies {request} + {reply} B; handshakes "
          f"{out['handshake_bytes_per_request_counted'] / 1e3:.1f} kB (counted)")
    print(f"per node-hour at one request every {PASS_SECONDS:g} s: {out['worker_cpu_s_per_hour']:.3f} s of "
          f"the worker's CPU, {out['bytes_per_node_hour'] / 1e3:.1f} kB (and as many handshakes answered by "
          "its kernel for the peers that measure it)")


if __name__ == "__main__":
    main()
