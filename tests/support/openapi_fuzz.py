"""schemathesis for the services' tests: every operation of a live server's OpenAPI document, with
generated valid and invalid inputs, sent unauthenticated, with a token, or signed by a key.

Passing means: no 5xx, every status and content type the server answers is documented, and every
documented response body matches its schema (intellect/openapi.py is what makes that true).

Tests call `run_fuzz`, which runs this module in a fresh interpreter: CPython 3.11.7 raises a spurious
"AST constructor recursion depth mismatch" when Hypothesis (which raises the recursion limit while it
runs) and pytest's import-time assertion rewriting parse code in one process (seen in a full run;
fixed upstream in 3.11.8). A separate process also keeps the server under test free of the fuzzer.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from intellect.identity import Wallet
from intellect.signing import sign_request

# schemathesis and Hypothesis are imported only in the fuzzing process (`main`): imported into a
# pytest process after its first tests, Hypothesis's modules went through pytest's assertion
# rewriting and hit the same CPython 3.11.7 "AST constructor recursion depth mismatch".
Call = Callable[[Any], Any]


def _checks() -> list[Any]:
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    return [not_a_server_error, status_code_conformance, content_type_conformance,
            response_schema_conformance]


class NodeSignature(requests.auth.AuthBase):
    """requests' auth that signs like `intellect.signing.SignedAuth` does for httpx."""

    def __init__(self, wallet: Wallet) -> None:
        self.wallet = wallet

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        body = request.body or b""
        raw = body.encode() if isinstance(body, str) else bytes(body)
        request.headers.update(sign_request(self.wallet, request.method or "GET", request.path_url, raw))
        return request


def _settings(examples: int) -> Any:
    from hypothesis import HealthCheck, settings

    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))  # fmt: skip


def fuzz(schema_url: str, call: Call, examples: int = 25) -> list[str]:
    """Every operation of the document at `schema_url`, valid and invalid inputs, sent by `call`
    (which validates the response); returns the operations run, so a test sees none was left out."""
    import schemathesis
    from hypothesis import given
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

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
    checks = _checks()
    return lambda case: case.call_and_validate(base_url=base_url, checks=checks, **kwargs)


REPO = Path(__file__).resolve().parents[2]


def run_fuzz(base_url: str, *, headers: dict[str, str] | None = None, sign_key: str | None = None,
             examples: int = 25, timeout: float = 900, request_timeout: float | None = None,
             ) -> list[str]:  # fmt: skip
    """Fuzz the server at `base_url` in a fresh interpreter; the operations run (raises on a finding)."""
    argv = [sys.executable, "-m", "tests.support.openapi_fuzz", base_url, "--examples", str(examples)]
    for name, value in (headers or {}).items():
        argv += ["--header", f"{name}: {value}"]
    if sign_key:
        argv += ["--sign-key", sign_key]
    if request_timeout:
        argv += ["--request-timeout", str(request_timeout)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    found = f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert done.returncode == 0, f"schemathesis found a problem:\n{found}"
    ran: list[str] = json.loads(done.stdout.strip().splitlines()[-1])["ran"]
    return ran


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="schemathesis over a live server's OpenAPI document")
    parser.add_argument("url", help="the server's base URL")
    parser.add_argument("--header", action="append", default=[], help="'Name: value', repeatable")
    parser.add_argument("--sign-key", help="sign every request with this private key (X-Intellect-*)")
    parser.add_argument("--examples", type=int, default=25, help="inputs per operation and mode")
    parser.add_argument("--request-timeout", type=float, help="seconds per request (long-polls wait longer "
                        "than the default 10 s)")
    args = parser.parse_args(argv)
    kwargs: dict[str, Any] = {}
    if args.header:
        kwargs["headers"] = dict(h.split(": ", 1) for h in args.header)
    if args.sign_key:
        kwargs["auth"] = NodeSignature(Wallet.from_key(args.sign_key))
    if args.request_timeout:
        kwargs["timeout"] = args.request_timeout
    ran = fuzz(f"{args.url}/openapi.json", validated(args.url, **kwargs), args.examples)
    print(json.dumps({"ran": ran}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
