"""Verifiers on right, wrong and malicious answers; the sandbox contains what it runs."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from workloads.datasets import load_dataset
from workloads.verifiers import SandboxLimits, TaskRecord, last_boxed, run_program, score
from workloads.verifiers.code import isolated

SQUARE = TaskRecord(
    problem_id="c1",
    task_type="code",
    prompt="square",
    verification_info={"test_cases": [{"input": "3\n", "output": "9\n"}, {"input": "-4\n", "output": "16"}]},
)
FAST = SandboxLimits(cpu_seconds=1, wall_seconds=4.0)


def rec(task_type: str, answer: str) -> TaskRecord:
    return TaskRecord(problem_id="p", task_type=task_type, prompt="q", verification_info={"answer": answer})


def test_synthetic():
    assert score(rec("arithmetic", "46"), "46") == 1.0
    assert score(rec("arithmetic", "46"), " 46\n") == 1.0
    assert score(rec("arithmetic", "46"), "47") == 0.0
    assert score(rec("reverse", "cba"), "abc") == 0.0
    assert score(rec("sort", "1234"), "1234") == 1.0


def test_math_boxed_and_equivalence():
    assert last_boxed(r"first \boxed{1} then \boxed{\frac{3}{4}} end") == r"\frac{3}{4}"
    assert last_boxed("no box") is None
    assert last_boxed(r"\boxed{unbalanced") is None
    assert score(rec("math", r"\frac{3}{4}"), r"so \boxed{0.75}") == 1.0
    assert score(rec("math", r"\frac{3}{4}"), r"\boxed{\frac{6}{8}}") == 1.0
    assert score(rec("math", r"5\sqrt{2}"), r"\boxed{\sqrt{50}}") == 1.0
    assert score(rec("math", "x^2+2x+1"), r"\boxed{(x+1)^2}") == 1.0
    assert score(rec("math", "56"), r"\boxed{54}") == 0.0
    assert score(rec("math", "56"), "56") == 0.0  # the answer must be boxed
    assert score(rec("math", "56"), r"\boxed{\frac{}{") == 0.0  # garbage is wrong, not a crash


def test_code_right_partial_wrong():
    assert score(SQUARE, "```python\nn = int(input())\nprint(n * n)\n```") == 1.0
    assert score(SQUARE, "```python\nn = int(input())\nprint(abs(n) * 3)\n```") == 0.5
    assert score(SQUARE, "print('nine')") == 0.0
    assert score(SQUARE, "raise SystemExit(3)") == 0.0


@pytest.mark.slow  # starts other interpreters (see tests/conftest.py)
def test_infinite_loop_is_stopped():
    started = time.monotonic()
    result = run_program("while True:\n    pass\n", "", FAST)
    assert time.monotonic() - started < 8
    assert result.timed_out or result.returncode != 0


def _left_in(sessions: list[int]) -> list[int]:
    """Processes still in one of `sessions`. The sandbox starts each program in a session of its own and
    a fork stays in its parent's session, so this is what a program left behind, whatever other tests
    (other pytest-xdist workers) run on the machine meanwhile."""
    left = []
    for pid in psutil.pids():
        try:
            if os.getsid(pid) in sessions:
                left.append(pid)
        except OSError:  # gone meanwhile
            continue
    return left


@pytest.mark.slow  # starts other interpreters (see tests/conftest.py)
def test_fork_bomb_is_contained(monkeypatch: pytest.MonkeyPatch) -> None:
    sessions: list[int] = []
    popen = subprocess.Popen

    def recording_popen(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        proc = popen(*args, **kwargs)
        sessions.append(proc.pid)  # started with start_new_session: its pid is its session's id
        return proc

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    started = time.monotonic()
    record = SQUARE.model_copy(
        update={"verification_info": {**SQUARE.verification_info, "limits": FAST.model_dump()}}
    )
    assert score(record, bomb) == 0.0
    assert time.monotonic() - started < 20
    assert sessions, "the program did not run"
    deadline = time.monotonic() + 5  # the kernel tears the PID namespace down asynchronously
    while _left_in(sessions) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _left_in(sessions) == []  # nothing left behind


def test_writes_outside_the_sandbox_do_not_reach_the_host(tmp_path):
    in_tmp = tmp_path / "pwned.txt"
    in_repo = Path(__file__).with_name("pwned-by-sandbox.txt")
    program = (
        f"for p in [{str(in_tmp)!r}, {str(in_repo)!r}, '/etc/pwned-by-sandbox']:\n"
        "    try:\n"
        "        open(p, 'w').write('x')\n"
        "        print('wrote', p)\n"
        "    except OSError as e:\n"
        "        print('refused', p)\n"
    )
    result = run_program(program, "", FAST)
    assert not in_tmp.exists()
    assert not in_repo.exists()
    assert not os.path.exists("/etc/pwned-by-sandbox")
    if isolated():  # as `nobody`, the repo and /etc refuse writes outright
        assert f"refused {in_repo}" in result.stdout
        assert "refused /etc/pwned-by-sandbox" in result.stdout


def test_big_output_and_memory_are_capped():
    result = run_program("while True:\n    print('x' * 1000)\n", "", FAST)
    assert len(result.stdout) <= FAST.file_bytes
    assert result.returncode != 0 or result.timed_out
    hog = run_program("a = bytearray(2 * 1024**3)\nprint('allocated')\n", "", FAST)
    assert "allocated" not in hog.stdout


@pytest.mark.skipif(not isolated(), reason="network isolation needs root and unshare")
def test_no_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        program = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    print('connected')\n"
            "except OSError:\n"
            "    print('blocked')\n"
        )
        assert run_program(program, "", FAST).stdout.strip() == "blocked"
    finally:
        server.close()


def test_shipped_datasets_load_and_verify():
    demo = load_dataset("demo")
    assert len(demo) == 512 and {r.task_type for r in demo} == {"arithmetic", "reverse", "sort"}
    for r in demo[:30]:
        assert score(r, r.verification_info["answer"]) == 1.0
    for r in load_dataset("math"):
        assert score(r, rf"\boxed{{{r.verification_info['answer']}}}") == 1.0
    assert len(load_dataset("code")) >= 4


def test_loader_parquet_jsonl_and_errors(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "task_id": ["a", "b"],
            "task_type": ["math", "arithmetic"],
            "prompt": ["1+1?", "1+1="],
            "verification_info": ['{"answer": "2"}', '{"answer": "2"}'],
        }
    )
    pq.write_table(table, tmp_path / "part-0.parquet")
    records = load_dataset(tmp_path)
    assert [r.problem_id for r in records] == ["a", "b"]
    assert records[0].verification_info == {"answer": "2"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem_id": "x", "task_type": "poetry", "prompt": "p", "verification_info": {}}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_dataset(bad)
    with pytest.raises(ValueError, match="not found"):
        load_dataset(tmp_path / "missing.jsonl")


def test_math_works_off_the_main_thread():
    import threading

    record = rec("math", r"\frac{3}{4}")
    out: list[float] = []
    worker = threading.Thread(target=lambda: out.append(score(record, r"\boxed{0.75}")))
    worker.start()
    worker.join()
    assert out == [1.0]
