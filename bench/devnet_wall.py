"""Where `make devnet`'s time goes (issue 42.3), side by side.

1. The cost that profiling found (py-spy on the demo's validators, worker daemons and trainer): a plain
   `httpx.get` builds a client, and a client builds an SSL context, for every call. Measured here on a
   loopback HTTP server: CPU per call with a new client each time (before) and with the process's
   shared client (`intellect.http_client`, after), and the ratio.
2. With `--demo`: one whole `intellect devnet up --demo` run (a fresh chain in a temporary folder),
   its wall time split into start-up, the 40 steps and wind-down, against the earlier measurements
   on the same kind of 2-core machine (issue 42: 170 s for the steps when it was fast, 299 s when it
   had slowed down).

    .venv/bin/python bench/devnet_wall.py [--calls 200] [--demo]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from intellect.http_client import shared

REPO = Path(__file__).resolve().parents[1]
EARLIER_STEPS = {"fast (before the slowdown)": 170.0, "slowed down (issue 42)": 299.0}


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        body = b'{"step": 1}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def per_call_cpu(calls: int) -> tuple[float, float]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/step"
    try:
        httpx.get(url)
        shared().get(url)  # warm both paths
        t0 = time.process_time()
        for _ in range(calls):
            httpx.get(url, timeout=5.0)
        before = (time.process_time() - t0) / calls
        t0 = time.process_time()
        for _ in range(calls):
            shared().get(url, timeout=5.0)
        after = (time.process_time() - t0) / calls
    finally:
        server.shutdown()
    return before, after


def demo() -> dict:
    with tempfile.TemporaryDirectory(prefix="devnet-wall-") as folder:
        cli = str(REPO / ".venv" / "bin" / "intellect")
        started = time.monotonic()
        run = subprocess.run([cli, "devnet", "up", "--demo", "--json", "--dir", folder], cwd=REPO,
                             capture_output=True, text=True)  # fmt: skip
        total = time.monotonic() - started
        subprocess.run([cli, "devnet", "down", "--dir", folder], cwd=REPO, capture_output=True)
    if run.returncode != 0:
        raise SystemExit(f"the demo failed (exit {run.returncode}): {run.stderr[-2000:]}")
    report = json.loads(run.stdout[run.stdout.index("{") :])
    report["command_seconds"] = total
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--demo", action="store_true", help="also run a whole demo (about 3 minutes)")
    args = parser.parse_args()
    before, after = per_call_cpu(args.calls)
    print(f"CPU per plain GET on loopback: a new client each call {before * 1e3:.2f} ms, the shared "
          f"client {after * 1e3:.2f} ms (×{before / after:.0f})")
    if args.demo:
        r = demo()
        steps = r.get("steps_seconds") or r["wall_seconds"]
        print(f"make devnet: {r['command_seconds']:.0f} s in all; start-up {r['startup_seconds']:.0f} s, "
              f"{r['steps']} steps {steps:.0f} s, wind-down {r['wall_seconds'] - steps:.0f} s")
        for name, earlier in EARLIER_STEPS.items():
            print(f"  steps against {name}: {earlier:.0f} s → ×{earlier / steps:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
