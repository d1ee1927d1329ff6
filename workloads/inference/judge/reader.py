"""Rollout files are read in a child process whose memory is capped.

The footer check (`workloads.rollouts.check_footer`) refuses a file that *declares* more than its task
allows. What it cannot see is a file that declares little and holds more: a data page header inside a
column chunk can state any uncompressed size, a dictionary page can be larger than its footer says,
and whatever pyarrow itself over-allocates for a crafted file is out of our hands. So the read itself
runs in a long-lived child with `RLIMIT_AS` set: a file that needs more memory than the cap fails
there with a memory error and gets an `invalidate` verdict naming the cap, while the validator process
(the model, the queue, the votes) never allocates a byte of it. A child that dies some other way
(killed, crashed) or hangs past the timeout proves nothing about the file: `ReaderFailed` is raised,
the judge loop retries the file, and after its attempts it is soft-invalidated, never slashed.

The cap is set far above what an honest file of any task can take (their declared sizes are already
bounded by the footer check): `DEFAULT_MEMORY_BYTES` of address space for one read, or 16× the bytes
the task's footer limits allow when that is more, on top of the child's own baseline (Python,
pyarrow, pydantic), measured when the child starts.

The validator's own environment may allow less: a hard `RLIMIT_AS` from `ulimit -v`, `prlimit`,
`docker --ulimit`, limits.conf or a batch scheduler, which no process can raise. The child then reads
under that lower ceiling, and a memory error below the cap it meant to set is the validator's own
limit, not evidence against the file: it is reported as `ReaderFailed` (retried, soft at worst, never
a slash), and the validator logs the shortfall once when the child starts.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import structlog

from workloads.rollouts import COLUMNS, BatchInfo, FileLimits, Rollout, RolloutSchemaError, RolloutTooLarge

log = structlog.get_logger(__name__)

DEFAULT_MEMORY_BYTES = 1 << 30  # address space a read may add to the child's baseline
DEFAULT_TIMEOUT = 120.0


class ReaderFailed(RuntimeError):
    """The reader process died or hung: nothing is known about the file (retried, never slashed)."""


def _serve(conn: Connection, budget: int) -> None:  # runs in the child (`-m ...judge.reader`)
    import pyarrow as pa

    from workloads.rollouts import read_rollouts

    # The system allocator, not mimalloc (which reserves a 1 GiB arena at its first allocation, so an
    # address-space cap would fail every read): ARROW_DEFAULT_MEMORY_POOL=system and MALLOC_ARENA_MAX=2
    # are set where the child is started (`pa.set_memory_pool` here was not enough: the footer reader
    # still went to mimalloc).
    baseline = _address_space()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    conn.send(("ready", (baseline, hard)))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        path, limits, cap = request
        wanted = baseline + cap
        _, hard = resource.getrlimit(resource.RLIMIT_AS)  # now: it may have been lowered since the start
        # Never above the hard limit the validator was started under (raising it is refused).
        ceiling = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_AS, (ceiling, hard))
            rows, info = read_rollouts(path, limits)
            conn.send(("ok", (rows, info)))
        except (MemoryError, pa.ArrowMemoryError) as exc:
            what = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            if ceiling < wanted:  # the validator's own limit was hit, not the reader's cap
                conn.send(("own-memory", f"out of memory under this validator's own hard address-space limit "
                                     f"({hard >> 20} MB, below the {wanted >> 20} MB the reader allows a "
                                     f"file): not the file's fault ({what})"))  # fmt: skip
            else:
                conn.send(("memory", what))
        except RolloutSchemaError as exc:
            conn.send(("schema", (type(exc) is RolloutTooLarge, str(exc))))
        except ValueError as exc:  # pyarrow's own refusals of a malformed file (ArrowInvalid)
            conn.send(("unreadable", str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__))
        except OSError as exc:
            conn.send(_os_error(exc, path, limits))
        except Exception as exc:  # anything else: the file cannot be said to be at fault (retry)
            first = str(exc).splitlines()[0][:300] if str(exc) else ""
            conn.send(("failed", f"{type(exc).__name__}: {first}"))


def _os_error(exc: OSError, path: str, limits: FileLimits) -> tuple[str, str]:
    """An OSError while reading. With an errno it is the system's (a missing file, an I/O error, too
    many open files): nothing is known about the file. Without one it is pyarrow's own word that the
    bytes do not decode (corrupt compression, a page header that does not parse): the file's fault
    (`invalidate`), since the validator hashed these bytes against the work key the node signed on
    chain before reading them, so they are the bytes the node submitted; storage or transit that
    corrupts a file changes its hash and is judged soft. Read once more first: a fault of this
    machine's (memory, disk) does not repeat the same way. (Left to the node: bytes its own disk
    corrupted between writing the file and hashing it are still its file.)"""
    from workloads.rollouts import read_rollouts

    first = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
    if exc.errno is not None:
        return "failed", f"{type(exc).__name__}: {first}"
    try:
        read_rollouts(path, limits)
    except OSError as again:
        second = str(again).splitlines()[0][:300] if str(again) else type(again).__name__
        if again.errno is None and second == first:
            return "unreadable", f"its bytes do not decode ({first})"
        return "failed", f"{type(again).__name__}: {second} (after {first})"
    except Exception as other:  # anything else the second time: not a repeatable fault of the file's
        return "failed", f"{type(other).__name__} on a second read (after {first})"
    return "failed", f"a read failed once and not again ({first})"


def _address_space() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


class CappedReader:
    """One reader child, started on first use and again after it dies; thread-safe (one read at a
    time). `read` returns the rows and batch info, or raises `RolloutSchemaError` (the file's fault:
    invalidate) or `ReaderFailed` (nobody's known fault: retry)."""

    def __init__(self, memory_bytes: int = DEFAULT_MEMORY_BYTES, timeout: float = DEFAULT_TIMEOUT,
                 per_declared_byte: int = 16) -> None:
        self.memory_bytes = memory_bytes
        self.per_declared_byte = per_declared_byte
        self.timeout = timeout
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._warned = False  # the shortfall of a hard memory limit is logged once

    def read(self, path: Path, limits: FileLimits) -> tuple[list[Rollout], BatchInfo]:
        cap = self.cap_for(limits)
        where = str(Path(path).resolve())  # the child runs in another folder: a relative path is ours
        with self._lock:
            conn = self._ensure()
            try:
                conn.send((where, limits, cap))
                if not conn.poll(self.timeout):
                    self._kill()
                    raise ReaderFailed(f"reading the file took over {self.timeout:.0f} s")
                kind, payload = conn.recv()
                if kind == "own-memory":
                    self._kill()  # a child that ran out of memory starts afresh for the next read
            except (EOFError, OSError, BrokenPipeError) as exc:
                code = self._process.poll() if self._process is not None else None
                self._kill()
                raise ReaderFailed(f"the reader process died (exit {code}): {type(exc).__name__}") from None
        return self._result(kind, payload, cap)

    def cap_for(self, limits: FileLimits) -> int:
        """The memory one read may take: `memory_bytes`, or for a task whose largest honest file is
        big, `per_declared_byte` (16) × the bytes its footer may declare (Python objects for 4-byte
        tokens take ~9×)."""
        declared = sum(limits.column_bytes(name) for name in COLUMNS)
        return max(self.memory_bytes, self.per_declared_byte * declared)

    def _result(self, kind: str, payload: Any, cap: int) -> tuple[list[Rollout], BatchInfo]:
        if kind == "ok":
            rows, info = payload
            return rows, info
        if kind == "memory":
            raise RolloutTooLarge(f"reading it needs more than the reader's {cap >> 20} MB of "
                                  f"memory ({payload}): its pages hold more than its footer declares")
        if kind == "failed":
            raise ReaderFailed(f"the reader could not read the file: {payload}")
        if kind == "own-memory":
            raise ReaderFailed(f"the reader ran out of memory: {payload}")
        if kind == "schema":
            too_large, message = payload
            raise (RolloutTooLarge if too_large else RolloutSchemaError)(message)
        raise RolloutSchemaError(f"the file cannot be read: {payload}")

    def _ensure(self) -> Connection:
        if self._process is not None and self._process.poll() is None and self._conn is not None:
            return self._conn
        self._kill()
        # A fresh interpreter, not a fork (the validator holds threads) nor multiprocessing's spawn
        # (which would import the entry point's main module: torch and the model).
        ours, theirs = socket.socketpair()
        process = subprocess.Popen(
            [sys.executable, "-m", "workloads.inference.judge.reader", "--fd", str(theirs.fileno()),
             "--budget", str(self.memory_bytes)],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[3],
            env={**os.environ, "MALLOC_ARENA_MAX": "2", "ARROW_DEFAULT_MEMORY_POOL": "system"},
        )  # fmt: skip
        theirs.close()
        conn = Connection(ours.detach())
        if not conn.poll(60.0):
            process.kill()
            conn.close()
            raise ReaderFailed("the reader process did not start within 60 s")
        _, (baseline, hard) = conn.recv()
        if hard != resource.RLIM_INFINITY and hard < baseline + self.memory_bytes and not self._warned:
            self._warned = True
            log.warning("reader memory below its cap", hard_limit_mb=hard >> 20,
                        cap_mb=(baseline + self.memory_bytes) >> 20,
                        effect="a file needing more than the hard limit is retried, never invalidated: "
                               "raise the hard RLIMIT_AS (ulimit -v) to judge such files")  # fmt: skip
        self._process, self._conn = process, conn
        return conn

    def _kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=5)
        if self._conn is not None:
            self._conn.close()
        self._process, self._conn = None, None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._process is not None and self._process.poll() is None:
                try:
                    self._conn.send(None)
                    self._process.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._kill()


_shared: CappedReader | None = None
_shared_lock = threading.Lock()


def shared_reader() -> CappedReader:
    """The process's one reader child (every task's pipeline reads through it)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = CappedReader()
        return _shared


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the validator's memory-capped rollout reader (internal)")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--budget", type=int, required=True)
    args = parser.parse_args()
    _serve(Connection(args.fd), args.budget)
