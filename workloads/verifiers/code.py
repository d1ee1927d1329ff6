"""Code verifier: run the completion's program on stdin/stdout test cases in a sandbox.

Containment, strongest available first:
- root with `unshare` (these machines, containers run as root): new PID, mount and network
  namespaces. No network interface but loopback; the host's world-writable directories (/tmp,
  /var/tmp, /dev/shm, /run/lock) are replaced by private tmpfs mounts that vanish with the run; the
  program runs as `nobody`, so everything else on the host is read-only to it; when the namespace's
  first process ends (or the wall timeout kills it) the kernel kills every process it spawned.
- otherwise (documented weaker mode): a plain subprocess in a temp dir, in its own session, killed
  by process group; network and writes to world-writable directories are not blocked.
Always: RLIMIT_CPU, RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE (stdout goes to a file, so it is capped
too), RLIMIT_NOFILE, a wall-clock timeout, a scrubbed environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, Field

from workloads.verifiers.records import TaskRecord

_CHILD = Path(__file__).with_name("sandbox_child.py")


class SandboxLimits(BaseModel):
    cpu_seconds: int = Field(2, ge=1)
    wall_seconds: float = Field(5.0, gt=0)
    memory_bytes: int = Field(512 * 2**20, ge=32 * 2**20)
    processes: int = Field(32, ge=1)
    file_bytes: int = Field(1 * 2**20, ge=1024)
    open_files: int = Field(64, ge=16)

    def rlimits(self) -> dict[str, int]:
        return {
            "RLIMIT_CPU": self.cpu_seconds,
            "RLIMIT_AS": self.memory_bytes,
            "RLIMIT_NPROC": self.processes,
            "RLIMIT_FSIZE": self.file_bytes,
            "RLIMIT_NOFILE": self.open_files,
        }


class RunResult(BaseModel):
    stdout: str
    returncode: int | None
    timed_out: bool
    seconds: float


def program_interpreter() -> str:
    """A Python the unprivileged `nobody` user can execute (the venv's may live under /root)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK) and os.stat(candidate).st_mode & 0o001:
            return candidate
    return sys.executable


def isolated() -> bool:
    """Whether the namespace sandbox is available (root and util-linux `unshare`)."""
    return os.geteuid() == 0 and shutil.which("unshare") is not None


def run_program(source: str, stdin: str, limits: SandboxLimits | None = None) -> RunResult:
    limits = limits or SandboxLimits()
    with tempfile.TemporaryDirectory(prefix="intellect-code-") as tmp:
        prog, out_path = Path(tmp) / "main.py", Path(tmp) / "stdout"
        prog.write_text(source)
        os.chmod(tmp, 0o755)
        if isolated():
            cmd = [
                "unshare", "--fork", "--pid", "--mount", "--net", "--kill-child", "--",
                sys.executable, "-I", str(_CHILD), str(prog), program_interpreter(),
                json.dumps(limits.rlimits()),
            ]  # fmt: skip
            preexec = None
        else:
            cmd = [sys.executable, "-I", "-S", str(prog)]

            def preexec() -> None:
                for name, value in limits.rlimits().items():
                    resource.setrlimit(getattr(resource, name), (value, value))

        started = time.monotonic()
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.DEVNULL,
                cwd=tmp,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                start_new_session=True,
                preexec_fn=preexec,
            )
            timed_out = False
            try:
                proc.communicate(stdin.encode(), timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc)
        with open(out_path, "rb") as f:
            stdout = f.read(limits.file_bytes).decode("utf-8", "replace")
        return RunResult(
            stdout=stdout,
            returncode=None if timed_out else proc.returncode,
            timed_out=timed_out,
            seconds=time.monotonic() - started,
        )


def _kill_group(proc: subprocess.Popen) -> None:
    # Kills the whole session; in the namespace sandbox killing `unshare` already takes every
    # process of the PID namespace with it.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(completion: str) -> str:
    """The last fenced code block, or the whole completion when there is none."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def _normalise(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def verify_code(record: TaskRecord, completion: str, limits: SandboxLimits | None = None) -> float:
    """Fraction of test cases whose stdout matches (trailing whitespace ignored); 0 on any crash."""
    cases = record.verification_info.get("test_cases")
    if not cases:
        raise ValueError(f"task {record.problem_id}: code verification_info needs non-empty 'test_cases'")
    limits = limits or SandboxLimits(**record.verification_info.get("limits", {}))
    source = extract_code(completion)
    passed = 0
    for case in cases:
        result = run_program(source, str(case["input"]), limits)
        if (
            not result.timed_out
            and result.returncode == 0
            and _normalise(result.stdout) == _normalise(str(case["output"]))
        ):
            passed += 1
    return passed / len(cases)
