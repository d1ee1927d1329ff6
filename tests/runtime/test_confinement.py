"""A process-runtime task never sees a key (issue 19.2): not in another process's environ or cmdline,
not in a file, not through a socket. The probe task (tests/fixtures/key_probe.py) looks everywhere;
the same probe run unconfined finds the neighbour's keys, so the test can tell the difference."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from intellect.wire.tasks import TaskState
from worker.runtime.bridge import TaskBridge
from worker.runtime.confinement import unavailable_reason

from .helpers import Harness, in_state, wait_for

PROBE = Path(__file__).resolve().parents[1] / "fixtures" / "key_probe.py"
FINISHED = in_state(TaskState.COMPLETED, TaskState.FAILED)


def key() -> str:
    return secrets.token_hex(32)


@pytest.fixture
def confinable() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"tasks cannot be confined here: {reason}")


@pytest.fixture
def neighbour(short_tmp: Path) -> Iterator[dict[str, str]]:
    """A service holding keys the careless way (environment, command line) and a careful way (a 0600
    file), plus a world-readable secret in the worker's state dir: none may reach the task."""
    keys = {"environ": key(), "cmdline": key(), "key_file": key(), "loose_file": key()}
    state = short_tmp / "state"
    state.mkdir(parents=True, exist_ok=True)
    key_file = state / "node.key"
    key_file.write_text(keys["key_file"])
    key_file.chmod(0o600)
    (state / "service.env").write_text(f"INTELLECT_WORKER_NODE_KEY={keys['loose_file']}\n")
    (state / "service.env").chmod(0o644)
    service = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; time.sleep(120)", f"--key={keys['cmdline']}"],
        env={**os.environ, "INTELLECT_ORCH_MANAGER_KEY": keys["environ"]},
    )
    yield keys
    service.kill()
    service.wait()


def run_probe(harness: Harness, planted: dict[str, str], roots: str, **config: object) -> dict:
    runtime = harness.runtime(**config)
    spec = harness.spec(
        env_vars={"OWN_KEY": planted["own_env"], "PROBE_ROOTS": roots, "PYTHONDONTWRITEBYTECODE": "1"}
    )
    spec = spec.model_copy(update={"entrypoint": [sys.executable, str(PROBE)], "cmd": []})
    desired = harness.assign(spec)
    data_dir = harness.data_dir(desired)
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "mine.txt").write_text(planted["own_file"])
    status = wait_for(runtime, desired, FINISHED, timeout=120)
    logs = "\n".join(runtime.logs(tail=30))
    assert status.state == TaskState.COMPLETED, (status, logs)
    return json.loads((data_dir / "probe.json").read_text())


@pytest.fixture
def process_harness(short_tmp: Path, bridge: TaskBridge) -> Iterator[Harness]:
    harness = Harness("process", short_tmp, bridge)
    yield harness
    harness.cleanup()


@pytest.mark.slow
def test_a_confined_task_finds_no_key_anywhere(
    confinable: None, process_harness: Harness, neighbour: dict[str, str]
) -> None:
    planted = {"own_env": key(), "own_file": key()}
    report = run_probe(process_harness, planted, "/")
    found = set(report["found"])
    # The probe works: it finds what the task was given on purpose.
    assert planted["own_env"] in found and planted["own_file"] in found, report
    assert report["seen"]["files"] > 50, report
    # It finds nothing else: no process but its own, no file outside its folders, no socket answer.
    leaked = {name for name, value in neighbour.items() if value in found}
    assert not leaked, {name: report["found"][neighbour[name]] for name in leaked}
    assert report["uid"] == 65534
    assert report["seen"]["processes"] <= 3, report


@pytest.mark.slow
def test_the_same_probe_unconfined_finds_the_neighbours_keys(
    confinable: None, process_harness: Harness, neighbour: dict[str, str]
) -> None:
    """The control: with isolation off the task runs as the (root) worker and reads them all."""
    planted = {"own_env": key(), "own_file": key()}
    report = run_probe(process_harness, planted, str(process_harness.root), task_isolation="off")
    found = set(report["found"])
    assert set(neighbour.values()) <= found, report
    assert report["uid"] == os.getuid()


def test_require_fails_a_task_that_cannot_be_confined(
    process_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker.runtime import process

    monkeypatch.setattr(process, "unavailable_reason", lambda: "the worker does not run as root")
    runtime = process_harness.runtime(task_isolation="require")
    desired = process_harness.assign(process_harness.spec("sleep:0.1"))
    status = wait_for(runtime, desired, FINISHED)
    assert status.state == TaskState.FAILED
    assert "cannot confine the task: the worker does not run as root" in (status.detail or "")
