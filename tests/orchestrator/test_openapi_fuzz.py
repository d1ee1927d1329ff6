"""schemathesis against the real orchestrator and discovery (uvicorn on loopback, real anvil and Redis):
every operation of their OpenAPI documents, with generated valid and invalid inputs, unauthenticated,
with the admin token, and signed by a node key (the `X-Intellect-*` headers). Passing means: no 5xx,
every status and content type the servers answer is documented, and every documented response
body matches its schema.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "uploads"))

from uploads_world import Orchestrator  # noqa: E402

from discovery.app import create_app as create_discovery  # noqa: E402
from discovery.chain import LedgerChainView  # noqa: E402
from discovery.settings import DiscoverySettings  # noqa: E402
from intellect.identity import Wallet  # noqa: E402
from intellect.redis_server import EmbeddedRedis  # noqa: E402
from intellect.signing import sign_request  # noqa: E402
from intellect.testing import serve_in_thread  # noqa: E402

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
FUZZ = settings(max_examples=30, deadline=None, derandomize=True,
                suppress_health_check=list(HealthCheck))  # fmt: skip


class NodeSignature(requests.auth.AuthBase):
    """requests' auth that signs like `intellect.signing.SignedAuth` does for httpx."""

    def __init__(self, wallet: Wallet) -> None:
        self.wallet = wallet

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        body = request.body or b""
        raw = body.encode() if isinstance(body, str) else bytes(body)
        request.headers.update(sign_request(self.wallet, request.method or "GET", request.path_url, raw))
        return request


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
    settings_ = DiscoverySettings(redis_url=redis.url, state_dir=tmp_path_factory.mktemp("disc"),
                                  pool_id=devnet.pool_id)  # fmt: skip
    server = serve_in_thread(create_discovery(settings_, LedgerChainView(devnet.client())))
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def orchestrator_schema(orch: Orchestrator) -> Any:
    return schemathesis.openapi.from_url(f"{orch.url}/openapi.json")


@pytest.fixture(scope="module")
def discovery_schema(discovery_url: str) -> Any:
    return schemathesis.openapi.from_url(f"{discovery_url}/openapi.json")


orchestrator_api = schemathesis.pytest.from_fixture("orchestrator_schema")
discovery_api = schemathesis.pytest.from_fixture("discovery_schema")
NODE = Wallet.create()


@orchestrator_api.parametrize()
@FUZZ
def test_orchestrator_unauthenticated(case: Any, orch: Orchestrator) -> None:
    case.call_and_validate(base_url=orch.url, checks=CHECKS)


@orchestrator_api.parametrize()
@FUZZ
def test_orchestrator_with_the_admin_token(case: Any, orch: Orchestrator) -> None:
    admin = {"Authorization": f"Bearer {orch.token}"}
    case.call_and_validate(base_url=orch.url, headers=admin, checks=CHECKS)


@orchestrator_api.parametrize()
@FUZZ
def test_orchestrator_signed_by_a_node(case: Any, orch: Orchestrator) -> None:
    case.call_and_validate(base_url=orch.url, auth=NodeSignature(NODE), checks=CHECKS)


@discovery_api.parametrize()
@FUZZ
def test_discovery_unauthenticated(case: Any, discovery_url: str) -> None:
    case.call_and_validate(base_url=discovery_url, checks=CHECKS)


@discovery_api.parametrize()
@FUZZ
def test_discovery_signed_by_a_node(case: Any, discovery_url: str) -> None:
    case.call_and_validate(base_url=discovery_url, auth=NodeSignature(NODE), checks=CHECKS)
