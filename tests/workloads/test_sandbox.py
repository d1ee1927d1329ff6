"""The code sandbox against each escape a program under test might try: all contained.

Needs what the verifier needs by default (root and util-linux `unshare`); the verifier refuses to run
code without them (SandboxUnavailable), which the last test checks.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import psutil
import pytest

from workloads.verifiers import SandboxLimits, TaskRecord, run_program, score
from workloads.verifiers.code import SandboxMaximums, SandboxUnavailable, isolated

pytestmark = pytest.mark.slow  # every test runs programs in sandboxed interpreters (see tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]
FAST = SandboxLimits(cpu_seconds=1, wall_seconds=4.0)
needs_isolation = pytest.mark.skipif(not isolated(), reason="the namespace sandbox needs root and unshare")


@needs_isolation
def test_host_files_do_not_exist_for_the_program() -> None:
    targets = ["/etc/passwd", str(REPO / "README.md"), str(Path(__file__)), "/root", "/proc/1/environ"]
    program = (
        "import os\n"
        f"for p in {targets!r}:\n"
        "    print(p, os.path.exists(p))\n"
        "print('root', sorted(os.listdir('/')))\n"
    )
    result = run_program(program, "", FAST)
    assert result.returncode == 0, result
    for target in targets:
        assert f"{target} False" in result.stdout
    listed = next(line for line in result.stdout.splitlines() if line.startswith("root "))
    assert "'etc'" not in listed and "'work'" not in listed and "'home'" not in listed


@needs_isolation
def test_a_record_cannot_raise_the_limits() -> None:
    huge = {"cpu_seconds": 10**9, "wall_seconds": 1e9, "memory_bytes": 2**40, "processes": 10**6,
            "file_bytes": 2**40, "open_files": 10**6}
    maximums = SandboxMaximums(max_cpu_seconds=1, max_wall_seconds=3.0, max_memory_bytes=256 * 2**20)
    capped = SandboxLimits(**huge).capped(maximums)
    assert (capped.cpu_seconds, capped.wall_seconds, capped.memory_bytes) == (1, 3.0, 256 * 2**20)
    assert capped.file_bytes == maximums.max_file_bytes and capped.processes == maximums.max_processes
    started = time.monotonic()
    spin = run_program("while True:\n    pass\n", "", SandboxLimits(**huge), maximums)
    assert time.monotonic() - started < 10 and (spin.timed_out or spin.returncode != 0)
    hog = run_program("a = bytearray(512 * 2**20)\nprint('allocated')\n", "", SandboxLimits(**huge), maximums)
    assert "allocated" not in hog.stdout
    # Through the verifier, with the defaults: the record's 1e9 s cannot hold the run for long.
    record = TaskRecord(problem_id="x", task_type="code", prompt="p",
                        verification_info={"test_cases": [{"input": "", "output": "1"}], "limits": huge})
    started = time.monotonic()
    assert score(record, "while True:\n    pass\n") == 0.0
    assert time.monotonic() - started <= SandboxMaximums().max_wall_seconds + 5


@needs_isolation
def test_a_daemonised_child_does_not_outlive_the_run() -> None:
    marker = f"sandbox-daemon-{uuid.uuid4().hex}"
    program = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.execv(sys.executable,\n"
        f"                 [sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])\n"
        "    os._exit(0)\n"
        "time.sleep(0.5)\n"
        "print('parent done')\n"
    )
    result = run_program(program, "", FAST)
    assert "parent done" in result.stdout

    def survivors() -> list[int]:
        found = []
        for process in psutil.process_iter(["cmdline"]):
            if marker in (process.info["cmdline"] or []):
                found.append(process.pid)
        return found

    deadline = time.monotonic() + 5  # the kernel tears the PID namespace down asynchronously
    while survivors() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert survivors() == []


@needs_isolation
def test_output_flood_and_fork_bomb_stay_within_limits() -> None:
    flood = run_program("while True:\n    print('x' * 4096)\n", "", FAST)
    assert len(flood.stdout) <= FAST.file_bytes and (flood.returncode != 0 or flood.timed_out)
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    started = time.monotonic()
    result = run_program(bomb + "print('unreachable')\n", "", FAST)
    assert time.monotonic() - started < 15 and "unreachable" not in result.stdout


def test_without_isolation_the_verifier_refuses_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("workloads.verifiers.code.isolated", lambda: False)
    with pytest.raises(SandboxUnavailable, match="unshare"):
        run_program("print(1)\n", "", FAST)
    weaker = run_program("print(1)\n", "", FAST, SandboxMaximums(require_isolation=False))
    assert weaker.stdout.strip() == "1"
