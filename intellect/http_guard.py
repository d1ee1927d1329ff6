"""What every HTTP service puts in front of its routes: a body size limit and a JSON nesting limit
enforced while the body streams in (before authentication and parsing), and error handlers that
always answer JSON.

Why here: an unsigned 1 GB chunked PUT used to be read whole before its 401, and a validation error
whose input held `1e400` or a lone surrogate crashed FastAPI's own handler into a plain-text 500.
Each service calls `guard(app, ...)` once when it builds its app.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from intellect.openapi import finish_openapi

log = structlog.get_logger(__name__)

DEFAULT_MAX_BODY = 1024 * 1024  # 1 MiB: every JSON body of the protocol is far smaller
# Every JSON body of the protocol nests a handful of levels; a parser that recurses once per level
# (Python's C JSON decoder) overflows the C stack on 100,000 levels and kills the process.
MAX_JSON_DEPTH = 64
_JSON_SPECIAL = re.compile(rb'[\[\]{}"\\]')


class JsonDepth:
    """Streaming nesting depth of a JSON text (brackets outside strings), fed chunk by chunk."""

    def __init__(self, limit: int = MAX_JSON_DEPTH) -> None:
        self.limit = limit
        self.depth = 0
        self.in_string = False
        self.escaped_at = -1  # absolute offset of the byte a backslash escapes
        self.offset = 0

    def feed(self, chunk: bytes) -> bool:
        """False as soon as the text nests deeper than the limit."""
        for m in _JSON_SPECIAL.finditer(chunk):
            at = self.offset + m.start()
            c = m.group()
            if self.in_string:
                if at == self.escaped_at:
                    continue
                if c == b"\\":
                    self.escaped_at = at + 1
                elif c == b'"':
                    self.in_string = False
            elif c == b'"':
                self.in_string = True
            elif c in (b"[", b"{"):
                self.depth += 1
                if self.depth > self.limit:
                    return False
            elif c in (b"]", b"}"):
                self.depth = max(0, self.depth - 1)
        self.offset += len(chunk)
        return True


class BodyLimit:
    """Pure ASGI middleware: refuse a body over its path's limit with 413, from the Content-Length
    header when there is one, else as soon as the streamed chunks pass the limit. Limits per path
    prefix (longest prefix wins); `None` means "no limit here" (e.g. a storage upload route that
    enforces its own size)."""

    def __init__(
        self, app: ASGIApp, default: int = DEFAULT_MAX_BODY, per_path: Mapping[str, int | None] | None = None
    ) -> None:
        self.app = app
        self.default = default
        self.per_path = sorted((per_path or {}).items(), key=lambda kv: len(kv[0]), reverse=True)

    def limit_for(self, path: str) -> int | None:
        for prefix, limit in self.per_path:
            if path.startswith(prefix):
                return limit
        return self.default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        if limit is None:
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _reply(send, 400, "Content-Length is not a number")
                    return
                if declared > limit:
                    await _drain_nothing(send, limit)
                    return
        seen = 0
        started = False
        refused = False
        depth = JsonDepth()

        async def counting_receive() -> Message:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                seen += len(chunk)
                if seen > limit:
                    # Answer 413 now, ourselves: an exception raised here would be turned into a 400
                    # by the framework's body parser. The app then sees the client as gone.
                    refused = True
                    if not started:
                        await _drain_nothing(send, limit)
                    return {"type": "http.disconnect"}
                if not depth.feed(chunk):  # before any parser sees it, also before authentication
                    refused = True
                    if not started:
                        await _reply(send, 400, f"JSON body nested deeper than {depth.limit} levels",
                                     close=True)  # fmt: skip
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 is already on the wire
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except Exception:
            if not refused:
                raise


async def _drain_nothing(send: Send, limit: int) -> None:
    # The rest of the body is never read: the server closes the connection after this answer.
    await _reply(send, 413, f"request body larger than {limit} bytes", close=True)


async def _reply(send: Send, status: int, reason: str, close: bool = False) -> None:
    body = JSONResponse({"detail": reason}).body
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def json_safe(value: Any) -> Any:
    """A copy of `value` that JSON can always encode: non-finite floats and odd strings become
    readable strings, exceptions their message, anything else its repr."""
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, bytes):
        return value[:200].decode("utf-8", "backslashreplace")
    if isinstance(value, Mapping):
        return {str(json_safe(k)): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, BaseException):
        return json_safe(str(value))
    return json_safe(repr(value))


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 body (`detail`: a list of {type, loc, msg, input}), made JSON-safe."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    detail = []
    for err in errors:
        item = {k: err[k] for k in ("type", "loc", "msg") if k in err}
        if "input" in err:
            item["input"] = err["input"]
        detail.append(json_safe(item))
    return JSONResponse({"detail": detail}, status_code=422)


# (exception class, status, message prefix): a dependency that is down is a 503 naming it.
Unavailable = tuple[type[Exception], int, str]


def unavailable_handler(status: int, what: str) -> Callable[[Request, Exception], Any]:
    async def handler(request: Request, exc: Exception) -> JSONResponse:
        log.warning("dependency unavailable", what=what, path=request.url.path, error=str(exc))
        return JSONResponse(
            {"detail": f"{what} unavailable: {json_safe(str(exc))[:300]}"}, status_code=status
        )

    return handler


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", path=request.url.path)
    return JSONResponse(
        {"detail": f"internal error ({type(exc).__name__}); see the service log"}, status_code=500
    )


def guard(
    app: FastAPI,
    *,
    max_body: int = DEFAULT_MAX_BODY,
    per_path: Mapping[str, int | None] | None = None,
    unavailable: list[Unavailable] | None = None,
) -> FastAPI:
    """Install the body limit and the JSON error handlers on `app`, and an OpenAPI document that lists
    those errors (intellect.openapi); returns `app`."""
    app.add_middleware(BodyLimit, default=max_body, per_path=dict(per_path or {}))
    finish_openapi(app)
    app.add_exception_handler(RequestValidationError, validation_error)
    for exc_type, status, what in unavailable or []:
        app.add_exception_handler(exc_type, unavailable_handler(status, what))
    app.add_exception_handler(Exception, internal_error)
    return app
