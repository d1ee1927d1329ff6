"""Fixtures for the runtime suite: the same behavioural tests run against both runtimes.

Docker tests need a real engine and the local test image (`scripts/ci-docker.sh` makes both).
Without them they skip with the reason, unless INTELLECT_REQUIRE_DOCKER=1 (CI), where they fail.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.runtime.bridge import TaskBridge

from .helpers import Harness, docker_problem


@pytest.fixture(scope="session")
def docker_ready() -> None:
    problem = docker_problem()
    if problem is None:
        return
    if os.environ.get("INTELLECT_REQUIRE_DOCKER") == "1":
        pytest.fail(f"INTELLECT_REQUIRE_DOCKER=1 but {problem}")
    pytest.skip(f"DOCKER TESTS SKIPPED: {problem}")


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # Unix socket paths are limited to 107 bytes: pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="irt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def bridge(short_tmp: Path) -> Iterator[TaskBridge]:
    # As start_runtime does: a root worker confines process tasks as nobody, whose group reaches the socket.
    task_gid = 65534 if os.geteuid() == 0 else None
    with TaskBridge(short_tmp / "sock" / "bridge.sock", short_tmp / "state", task_gid) as server:
        yield server


@pytest.fixture(params=["process", "docker"])
def harness(request: pytest.FixtureRequest, short_tmp: Path, bridge: TaskBridge) -> Iterator[Harness]:
    if request.param == "docker":
        request.getfixturevalue("docker_ready")
    h = Harness(request.param, short_tmp, bridge)
    yield h
    h.cleanup()
