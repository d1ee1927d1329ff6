"""Process-runtime supervisor: runs one task command, restarts it on failure, records its state.

It is to the process runtime what containerd-shim is to Docker: it outlives the worker, so a
restarted worker adopts the task (and reads its exit code) instead of orphaning it. Standard
library only and run by file path, so it starts fast and imports nothing of the worker.

  python supervise.py --run-dir DIR --max-restarts N --restart-delay S --cwd DIR -- CMD...

Writes DIR/state.json atomically: state (running, restarting, completed, failed, stopped),
child pid, restart count, exit code, detail. The command's stdout and stderr go to DIR/output.log.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

MAX_BACKOFF = 30.0


class Supervisor:
    def __init__(self, run_dir: Path, argv: list[str], cwd: str, max_restarts: int, delay: float) -> None:
        self.run_dir, self.argv, self.cwd = run_dir, argv, cwd
        self.max_restarts, self.delay = max_restarts, delay
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.restarts = 0

    def write_state(self, state: str, exit_code: int | None = None, detail: str | None = None) -> None:
        record = {
            "state": state,
            "supervisor_pid": os.getpid(),
            "child_pid": self.child.pid if self.child else None,
            "restart_count": self.restarts,
            "exit_code": exit_code,
            "detail": detail,
            "updated_at": time.time(),
        }
        tmp = self.run_dir / "state.json.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.run_dir / "state.json")

    def on_term(self, signum: int, _frame: object) -> None:
        self.stopping = True
        if self.child and self.child.poll() is None:
            self.child.send_signal(signum)

    def log(self, handle, text: str) -> None:  # type: ignore[no-untyped-def]
        handle.write(f"[supervisor {time.strftime('%Y-%m-%dT%H:%M:%S')}] {text}\n".encode())
        handle.flush()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_term)
        signal.signal(signal.SIGINT, self.on_term)
        with (self.run_dir / "output.log").open("ab", buffering=0) as log:
            while True:
                self.log(log, f"start (restart {self.restarts}/{self.max_restarts}): {self.argv[0]}")
                try:
                    self.child = subprocess.Popen(
                        self.argv,
                        cwd=self.cwd,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                    )
                except OSError as exc:
                    # Not restartable: the same command will not appear by retrying.
                    self.log(log, f"cannot start: {exc}")
                    self.write_state("failed", 127, f"cannot start {self.argv[0]!r}: {exc.strerror or exc}")
                    return 127
                self.write_state("running")
                code = self.child.wait()
                self.log(log, f"exited with code {code}")
                if self.stopping:
                    self.write_state("stopped", code, "stopped by the worker")
                    return 0
                if code == 0:
                    self.write_state("completed", 0)
                    return 0
                if self.restarts >= self.max_restarts:
                    self.write_state(
                        "failed", code, f"exited with code {code} after {self.restarts} restart(s)"
                    )
                    return 0
                self.restarts += 1
                self.write_state("restarting", code, f"exited with code {code}; restart {self.restarts}")
                deadline = time.monotonic() + min(self.delay * 2 ** (self.restarts - 1), MAX_BACKOFF)
                while time.monotonic() < deadline and not self.stopping:
                    time.sleep(0.05)
                if self.stopping:
                    self.write_state("stopped", code, "stopped by the worker")
                    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--max-restarts", type=int, default=3)
    parser.add_argument("--restart-delay", type=float, default=1.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    return Supervisor(args.run_dir, command, args.cwd, args.max_restarts, args.restart_delay).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
