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
from typing import BinaryIO

MAX_BACKOFF = 30.0
OWNER_POLL = 1.0  # seconds between looks at the owning worker


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (with the pid: one process, never reused)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def write_owner(path: Path, pid: int) -> None:
    """Mark the worker process `pid` as the owner of the runs under `path`'s directory."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": pid, "start_ticks": start_ticks(pid)}))
    os.replace(tmp, path)


def read_owner(path: Path) -> tuple[int, int | None] | None:
    try:
        record = json.loads(path.read_text())
        return int(record["pid"]), record.get("start_ticks")
    except (OSError, ValueError, KeyError, TypeError):
        return None


def owner_alive(pid: int, ticks: int | None) -> bool:
    now = start_ticks(pid)
    return now is not None and (ticks is None or now == ticks)


class Supervisor:
    def __init__(self, run_dir: Path, argv: list[str], cwd: str, max_restarts: int, delay: float) -> None:
        self.run_dir, self.argv, self.cwd = run_dir, argv, cwd
        self.max_restarts, self.delay = max_restarts, delay
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.restarts = 0
        self.owner_file: Path | None = None
        self.orphan_ttl = 15.0
        self.orphaned_detail: str | None = None

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

    def log(self, handle: BinaryIO, text: str) -> None:
        handle.write(f"[supervisor {time.strftime('%Y-%m-%dT%H:%M:%S')}] {text}\n".encode())
        handle.flush()

    def wait_or_orphaned(self) -> int:
        """The child's exit code; if the worker that owns this run is gone for `orphan_ttl` seconds
        (and no restarted worker adopted the run by rewriting the owner file), stop the child."""
        assert self.child is not None
        gone_since: float | None = None
        while True:
            try:
                return self.child.wait(timeout=OWNER_POLL)
            except subprocess.TimeoutExpired:
                pass
            if self.owner_file is None:
                continue
            owner = read_owner(self.owner_file)
            if owner is not None and owner_alive(*owner):
                gone_since = None
                continue
            gone_since = gone_since or time.monotonic()
            if time.monotonic() - gone_since >= self.orphan_ttl:
                self.orphaned_detail = (f"the worker owning this task ({owner[0] if owner else 'unknown'}) "
                                        f"was gone for {self.orphan_ttl:.0f} s: task stopped")
                self.stopping = True
                self.child.terminate()
                try:
                    return self.child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.child.kill()
                    return self.child.wait()

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
                code = self.wait_or_orphaned()
                self.log(log, f"exited with code {code}")
                if self.orphaned_detail:
                    self.log(log, self.orphaned_detail)
                    self.write_state("stopped", code, self.orphaned_detail)
                    return 0
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
    parser.add_argument("--owner-file", type=Path, default=None, help="the owning worker (write_owner)")
    parser.add_argument("--orphan-ttl", type=float, default=15.0, help="stop the task after the owner "
                        "is gone this long")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    supervisor = Supervisor(args.run_dir, command, args.cwd, args.max_restarts, args.restart_delay)
    supervisor.owner_file, supervisor.orphan_ttl = args.owner_file, args.orphan_ttl
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
