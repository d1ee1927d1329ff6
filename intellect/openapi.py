"""Make a service's OpenAPI document say what the service really does.

FastAPI documents a route's success response and its 422; our services also answer 400 (malformed
headers or path), 401/403 (signatures, tokens), 404, 409, 413 (the body limit of
`intellect.http_guard`), 429 and 502/503 (a dead chain or Redis), all with the JSON body
`{"detail": "<reason>"}`. Request bodies that routes read themselves (signed bytes) are declared with
`openapi_extra`, whose pydantic schemas carry `#/$defs/...` references that no client can resolve.
`finish_openapi(app)` fixes both once the routes are in place: every operation lists the errors it
can answer (public endpoints only the transport ones), `$defs` move to `components/schemas`, and
`/metrics` is documented as the Prometheus text it is. Checked by schemathesis in the test suite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR_BODY = "ErrorBody"
REASONS: dict[int, str] = {
    400: "Malformed request: a header, the path or the query is not what the route expects",
    401: "Missing or invalid credentials (admin token or request signature)",
    403: "Authenticated, but not allowed (wrong token, unknown signer, node not in the right state)",
    404: "No such resource",
    405: "Method not allowed on this path",
    409: "Conflicts with the current state (duplicate, replayed nonce, already done)",
    413: "Request body larger than the route's limit (refused while streaming, before parsing)",
    422: "The body or a parameter fails validation; the detail names the field",
    429: "Too many requests",
    502: "An upstream the request needs (the chain's RPC) did not answer",
    503: "A store the request needs (Redis, the database) is unavailable",
}
TRANSPORT_ERRORS = (405, 413, 429, 503)
"""What any endpoint, public or not, may answer."""
PROTECTED_ERRORS = (400, 401, 403, 404, 405, 409, 413, 422, 429, 502, 503)
"""What an endpoint behind a token or a signature may answer."""
PUBLIC_PATHS = frozenset({"/health", "/metrics", "/openapi.json", "/docs", "/redoc"})


def _error_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "title": ERROR_BODY,
        "properties": {"detail": {"title": "Detail", "description": "why, in words a user can act on"}},
        "required": ["detail"],
    }


def _lift_defs(node: Any, schemas: dict[str, Any]) -> None:
    """Move every nested `$defs` into `schemas` and point `#/$defs/X` references at components."""
    if isinstance(node, dict):
        defs = node.pop("$defs", None)
        if isinstance(defs, dict):
            for name, schema in defs.items():
                schemas.setdefault(name, schema)
                _lift_defs(schema, schemas)
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            node["$ref"] = "#/components/schemas/" + ref.removeprefix("#/$defs/")
        for value in node.values():
            _lift_defs(value, schemas)
    elif isinstance(node, list):
        for item in node:
            _lift_defs(item, schemas)


def _document_errors(paths: dict[str, Any], public: Iterable[str]) -> None:
    public_paths = set(public)
    ref = {"$ref": f"#/components/schemas/{ERROR_BODY}"}
    for path, operations in paths.items():
        codes = TRANSPORT_ERRORS if path in public_paths else PROTECTED_ERRORS
        for operation in operations.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            for code in codes:
                operation["responses"].setdefault(str(code), {
                    "description": REASONS[code], "content": {"application/json": {"schema": ref}},
                })  # fmt: skip


def finish_openapi(
    app: FastAPI, public_paths: Iterable[str] = PUBLIC_PATHS, text_paths: Iterable[str] = ("/metrics",)
) -> Callable[[], dict[str, Any]]:
    """Install an `app.openapi` that generates the document once, then fixes it as described above."""
    public, text = frozenset(public_paths), frozenset(text_paths)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, description=app.description,
                          routes=app.routes, tags=app.openapi_tags)  # fmt: skip
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        _lift_defs(doc.get("paths", {}), schemas)
        schemas[ERROR_BODY] = _error_schema()
        paths = doc.get("paths", {})
        _document_errors(paths, public)
        for path in text & set(paths):
            get = paths[path].get("get")
            if get is not None:
                get["responses"]["200"]["content"] = {"text/plain": {"schema": {"type": "string"}}}
        app.openapi_schema = doc
        return doc

    app.__dict__["openapi"] = openapi  # FastAPI's documented override, as an instance attribute
    return openapi
