"""schemathesis against the real orchestrator and discovery (uvicorn on loopback, real anvil and Redis):
every operation of their OpenAPI documents, with generated valid and invalid inputs, unauthenticated,
with the admin token, and signed by a node key (the `X-Intellect-*` headers). Passing means: no 5xx,
every status and content type the servers answer is documented, and every documented response
body matches its schema.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
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


Call = Callable[[Any], Any]


def fuzz(schema_url: str, call: Call, examples: int = 25) -> list[str]:
    """Every operation of the document at `schema_url`, with valid and invalid generated inputs, sent
    by `call`; returns the labels of the operations run (so a test sees nothing was left out)."""
    schema = schemathesis.openapi.from_url(schema_url)
    ran = []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @FUZZ_SETTINGS(examples)
            def check(case: Any) -> None:
                call(case)

            try:
                check()
            except Unsatisfiable:
                # Nothing to break: an operation without parameters or body has no invalid input.
                assert mode == GenerationMode.NEGATIVE, operation.label
        ran.append(operation.label)
    return ran


def FUZZ_SETTINGS(examples: int) -> settings:  # noqa: N802
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))  # fmt: skip


NODE = Wallet.create()


def test_orchestrator(orch: Orchestrator) -> None:
    admin = {"Authorization": f"Bearer {orch.token}"}
    for name, call in {
        "unauthenticated": lambda case: case.call_and_validate(base_url=orch.url, checks=CHECKS),
        "admin token": lambda case: case.call_and_validate(base_url=orch.url, headers=admin, checks=CHECKS),
        "node signature": lambda case: case.call_and_validate(
            base_url=orch.url, auth=NodeSignature(NODE), checks=CHECKS),
    }.items():
        ran = fuzz(f"{orch.url}/openapi.json", call)
        assert {"POST /tasks", "POST /heartbeat", "GET /nodes"} <= set(ran), (name, ran)


def test_discovery(discovery_url: str) -> None:
    for call in (
        lambda case: case.call_and_validate(base_url=discovery_url, checks=CHECKS),
        lambda case: case.call_and_validate(base_url=discovery_url, auth=NodeSignature(NODE), checks=CHECKS),
    ):
        ran = fuzz(f"{discovery_url}/openapi.json", call)
        assert any(label.startswith("PUT /nodes") for label in ran), ran
