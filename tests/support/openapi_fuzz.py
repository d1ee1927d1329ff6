"""schemathesis for the services' tests: every operation of a live server's OpenAPI document, with
generated valid and invalid inputs, sent unauthenticated, with a token, or signed by a key.

Passing means: no 5xx, every status and content type the server answers is documented, and every
documented response body matches its schema (intellect/openapi.py is what makes that true).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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

from intellect.identity import Wallet
from intellect.signing import sign_request

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
Call = Callable[[Any], Any]


class NodeSignature(requests.auth.AuthBase):
    """requests' auth that signs like `intellect.signing.SignedAuth` does for httpx."""

    def __init__(self, wallet: Wallet) -> None:
        self.wallet = wallet

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        body = request.body or b""
        raw = body.encode() if isinstance(body, str) else bytes(body)
        request.headers.update(sign_request(self.wallet, request.method or "GET", request.path_url, raw))
        return request


def _settings(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))  # fmt: skip


def fuzz(schema_url: str, call: Call, examples: int = 25) -> list[str]:
    """Every operation of the document at `schema_url`, valid and invalid inputs, sent by `call`
    (which validates the response); returns the operations run, so a test sees none was left out."""
    schema = schemathesis.openapi.from_url(schema_url)
    ran = []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @_settings(examples)
            def check(case: Any) -> None:
                call(case)

            try:
                check()
            except Unsatisfiable:
                # Nothing to break: an operation without parameters or body has no invalid input.
                assert mode == GenerationMode.NEGATIVE, operation.label
        ran.append(operation.label)
    return ran


def validated(base_url: str, **kwargs: Any) -> Call:
    """A `call` that sends the case to `base_url` (with `headers=`/`auth=`) and runs CHECKS."""
    return lambda case: case.call_and_validate(base_url=base_url, checks=CHECKS, **kwargs)
