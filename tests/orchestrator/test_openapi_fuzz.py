"""schemathesis against the real orchestrator and discovery (uvicorn on loopback, real anvil and Redis):
every operation of their OpenAPI documents, with generated valid and invalid inputs, unauthenticated,
with the admin token, and signed by a node key (tests/support/openapi_fuzz.py).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "uploads"))

from uploads_world import Orchestrator  # noqa: E402

from discovery.app import create_app as create_discovery  # noqa: E402
from discovery.chain import LedgerChainView  # noqa: E402
from discovery.settings import DiscoverySettings  # noqa: E402
from intellect.identity import Wallet  # noqa: E402
from intellect.redis_server import EmbeddedRedis  # noqa: E402
from tests.support.openapi_fuzz import run_fuzz  # noqa: E402
from tests.support.testing import serve_in_thread  # noqa: E402

NODE_KEY = Wallet.create().private_key_hex()


@pytest.fixture(scope="module")
def redis() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture(scope="module")
def orch(
    devnet: Any, redis: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Orchestrator]:
    o = Orchestrator(devnet, redis.url, tmp_path_factory.mktemp("orch")).start()
    yield o
    o.stop()


@pytest.fixture(scope="module")
def discovery_url(
    devnet: Any, redis: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    settings = DiscoverySettings(redis_url=redis.url, state_dir=tmp_path_factory.mktemp("disc"),
                                 pool_id=devnet.pool_id)  # fmt: skip
    server = serve_in_thread(create_discovery(settings, LedgerChainView(devnet.client())))
    yield server.url
    server.stop()


def test_orchestrator(orch: Orchestrator) -> None:
    admin = {"Authorization": f"Bearer {orch.token}"}
    for ran in (run_fuzz(orch.url), run_fuzz(orch.url, headers=admin), run_fuzz(orch.url, sign_key=NODE_KEY)):
        assert {"POST /tasks", "POST /heartbeat", "GET /nodes"} <= set(ran), ran


def test_discovery(discovery_url: str) -> None:
    for ran in (run_fuzz(discovery_url), run_fuzz(discovery_url, sign_key=NODE_KEY)):
        assert any(label.startswith("PUT /nodes") for label in ran), ran
