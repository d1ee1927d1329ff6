"""Code verifier: run the completion's program on stdin/stdout test cases in a sandbox.

Containment (util-linux `unshare` + chroot as root; no extra package, which is why not bubblewrap):
- new PID, mount and network namespaces: no network interface but loopback; when the namespace's
  first process ends (or the wall timeout kills it) the kernel kills every process it spawned, so a
  daemonised child does not outlive the run;
- an empty root on a tmpfs with only the interpreter, its standard library and the directories of
  its shared libraries bind-mounted read-only, plus a writable /tmp/work: no host file (/etc/passwd,
  the project checkout, the worker's keys) exists for the program; it runs as a user id of its own
  (not `nobody`: RLIMIT_NPROC counts a user's processes machine-wide) after the
  chroot, so it cannot leave it;
- RLIMIT_CPU, RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE (stdout goes to a file, so it is capped too),
  RLIMIT_NOFILE, a wall-clock timeout, a scrubbed environment.
A dataset record may ask for other limits (`verification_info.limits`), but never above the
verifier's own maximums (`SandboxMaximums`, env `INTELLECT_SANDBOX_*`). Without root or `unshare`
the verifier refuses to run code (`SandboxUnavailable`) unless `INTELLECT_SANDBOX_REQUIRE_ISOLATION`
is false, which accepts a documented weaker mode: a plain subprocess with the same limits, in its own
session, killed by process group, that can read host files and use the network.
"""

from __future__ import annotations

import contextlib
import functools
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
from pydantic_settings import BaseSettings, SettingsConfigDict

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


    def capped(self, maximums: SandboxMaximums) -> SandboxLimits:
        """These limits, none above the verifier's maximums (a record cannot switch the sandbox off)."""
        return SandboxLimits(
            cpu_seconds=min(self.cpu_seconds, maximums.max_cpu_seconds),
            wall_seconds=min(self.wall_seconds, maximums.max_wall_seconds),
            memory_bytes=min(self.memory_bytes, maximums.max_memory_bytes),
            processes=min(self.processes, maximums.max_processes),
            file_bytes=min(self.file_bytes, maximums.max_file_bytes),
            open_files=min(self.open_files, maximums.max_open_files),
        )


class SandboxMaximums(BaseSettings):
    """The verifier's own ceilings over what a dataset record may ask for (env `INTELLECT_SANDBOX_*`)."""

    model_config = SettingsConfigDict(env_prefix="INTELLECT_SANDBOX_", env_file=".env", extra="ignore")

    max_cpu_seconds: int = Field(10, ge=1, description="CPU seconds per test case")
    max_wall_seconds: float = Field(20.0, gt=0, description="wall-clock seconds per test case")
    max_memory_bytes: int = Field(1 * 2**30, ge=32 * 2**20, description="address space (RLIMIT_AS)")
    max_processes: int = Field(64, ge=1, description="processes of the sandbox's own user id (RLIMIT_NPROC)")
    max_file_bytes: int = Field(16 * 2**20, ge=1024, description="largest file, stdout included")
    max_open_files: int = Field(256, ge=16, description="open file descriptors")
    require_isolation: bool = Field(True, description="refuse to run code without the namespace sandbox")


class SandboxUnavailable(RuntimeError):
    """The namespace sandbox cannot be built here; the message says what is missing."""


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


@functools.cache
def interpreter_binds(python: str) -> tuple[str, ...]:
    """What the program's root holds, read-only: the interpreter, its standard library (with
    lib-dynload) and the directories of the shared libraries it links, plus the dynamic loader."""
    real = os.path.realpath(python)
    stdlib = subprocess.run([real, "-I", "-S", "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                            capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    linked = subprocess.run(["ldd", real], capture_output=True, text=True, check=True, timeout=30).stdout
    binds = {real, stdlib}
    for line in linked.splitlines():
        path = line.split("=>")[-1].split("(")[0].strip()
        if path.startswith("/"):
            binds.add(path if "ld-linux" in path else os.path.dirname(path))
    return tuple(sorted(binds))


def run_program(
    source: str, stdin: str, limits: SandboxLimits | None = None, maximums: SandboxMaximums | None = None
) -> RunResult:
    maximums = maximums or SandboxMaximums()
    limits = (limits or SandboxLimits()).capped(maximums)
    if not isolated() and maximums.require_isolation:
        raise SandboxUnavailable(
            "the code sandbox needs root and util-linux `unshare` (apt-get install util-linux); "
            "set INTELLECT_SANDBOX_REQUIRE_ISOLATION=false to accept the weaker subprocess mode")
    with tempfile.TemporaryDirectory(prefix="intellect-code-") as tmp:
        prog, out_path = Path(tmp) / "main.py", Path(tmp) / "stdout"
        prog.write_text(source)
        os.chmod(tmp, 0o755)
        if isolated():
            python = os.path.realpath(program_interpreter())
            (Path(tmp) / "root").mkdir()
            cmd = [
                "unshare", "--fork", "--pid", "--mount", "--net", "--kill-child", "--",
                sys.executable, "-I", str(_CHILD), str(prog), str(Path(tmp) / "root"), python,
                json.dumps(interpreter_binds(python)), json.dumps(limits.rlimits()),
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
    # The record's limits are a request; run_program caps them at the verifier's maximums.
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
