"""The orchestrator's app class: the routes of a hot router are served ahead of the middleware stack.

Why: every worker heartbeats every few seconds, so in a large pool `POST /heartbeat` is nearly all the
orchestrator serves, and what the framework does around a route is a large share of its cost. In
process (`bench/heartbeat_app.py`: the real app with its lifespan, an embedded Redis and SQLite, driven
through ASGI), a heartbeat costs ~200 µs of CPU when its endpoint is called straight from the app and
~300 µs when the same route is reached as an ordinary one: the middleware stack (server errors,
FastAPI's telemetry and body limit, the guard's body limit, the exception middleware, the exit stack),
FastAPI's router over the included routers, and its request/response wrapper. Handing the request to
the router past the middleware still costs ~235 µs: the router and the wrapper alone add a sixth.

So a hot router's routes are declared as ordinary routes in `orchestrator/api/routes/` (one route per
path, in the OpenAPI document, mountable alone on a plain app in a test), and `include_hot_router`
also records each route's endpoint, which `OrchestratorApp` calls with the `Request` alone for that
method and exact path, before the stack. What the stack would do for it the endpoint does itself: it
bounds the body in size and JSON depth before parsing it (`orchestrator.heartbeat.read_body`), and an
exception it raises becomes the response the app's own exception handlers give (the same 4xx, 422,
503 and 500 JSON). Every other request, and any other method on such a path, takes the stack.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.routing import APIRoute
from starlette.types import Receive, Scope, Send

Endpoint = Callable[[Request], Awaitable[Response]]


class OrchestratorApp(FastAPI):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._hot: dict[tuple[str, str], Endpoint] = {}

    def include_hot_router(self, router: APIRouter) -> None:
        """Include `router` as any other, and serve its routes ahead of the middleware stack. Each must be
        `async def endpoint(request: Request) -> Response` (no dependency or parameter for FastAPI to
        solve): checked here, when the app is built."""
        self.include_router(router)
        for route in router.routes:
            if not isinstance(route, APIRoute):
                raise TypeError(f"hot router {router!r}: {route!r} is not an APIRoute")
            dependant = route.dependant
            solved = (dependant.path_params, dependant.query_params, dependant.header_params,
                      dependant.cookie_params, dependant.body_params, dependant.dependencies)  # fmt: skip
            if any(solved) or dependant.request_param_name is None \
                    or not inspect.iscoroutinefunction(route.endpoint):  # fmt: skip
                raise TypeError(f"hot route {route.path}: the endpoint must be `async def f(request: "
                                "Request) -> Response`, with nothing for FastAPI to solve")
            for method in route.methods or ():
                self._hot[(method, route.path)] = route.endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self._hot.get((scope["method"], scope["path"])) if scope["type"] == "http" else None
        if endpoint is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        request = Request(scope, receive)
        try:
            response = await endpoint(request)
        except Exception as exc:  # noqa: BLE001 - answered as the app's handlers answer it
            response = await self._handled(request, exc)
        await response(scope, receive, send)

    async def _handled(self, request: Request, exc: Exception) -> Response:
        for cls in type(exc).__mro__:
            handler = self.exception_handlers.get(cls)
            if handler is not None:
                result = handler(request, exc)
                if inspect.isawaitable(result):
                    result = await result
                if isinstance(result, Response):
                    return result
        raise exc
