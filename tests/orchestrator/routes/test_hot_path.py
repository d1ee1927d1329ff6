"""The heartbeat's one route (orchestrator/api/routes/heartbeat.py) and the hot path that serves it.

No Redis, chain or lifespan: a stand-in handler on `app.state.heartbeat`. The real handler behind the
served app is tested end to end in tests/orchestrator/test_heartbeat_fastpath.py.
"""

from __future__ import annotations

from typing import Annotated

import pytest
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient
from starlette.types import ASGIApp, Receive, Scope, Send

from intellect.http_guard import guard
from orchestrator.api.hot_path import OrchestratorApp
from orchestrator.api.routes import heartbeat

other = APIRouter()


@other.get("/ping")
async def ping() -> dict[str, str]:
    return {"pong": "yes"}


class StandIn:
    """Answers what it is told to: a body, or an exception raised from inside the route."""

    def __init__(self) -> None:
        self.raise_next: Exception | None = None
        self.seen = 0

    async def handle(self, request: Request) -> Response:
        self.seen += 1
        if self.raise_next is not None:
            raise self.raise_next
        return Response(b'{"current_task": null, "interval_seconds": 5.0}', media_type="application/json")


class Crossed:
    """Middleware counting the requests that went through the app's stack."""

    paths: list[str] = []

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            Crossed.paths.append(f"{scope['method']} {scope['path']}")
        await self.app(scope, receive, send)


def served(app: FastAPI) -> tuple[FastAPI, StandIn]:
    handler = StandIn()
    app.state.heartbeat = handler
    app.add_middleware(Crossed)
    Crossed.paths = []
    return guard(app), handler


def test_the_route_answers_on_a_plain_app_through_the_stack() -> None:
    plain = FastAPI()
    plain.include_router(heartbeat.router)
    app, handler = served(plain)
    with TestClient(app) as client:
        reply = client.post("/heartbeat", content=b"{}")
        assert reply.json() == {"current_task": None, "interval_seconds": 5.0}
    assert handler.seen == 1 and Crossed.paths == ["POST /heartbeat"]


def test_the_served_app_calls_the_same_route_ahead_of_the_stack() -> None:
    hot = OrchestratorApp()
    hot.include_router(other)
    hot.include_hot_router(heartbeat.router)
    app, handler = served(hot)
    with TestClient(app) as client:
        assert client.post("/heartbeat", content=b"{}").status_code == 200
        assert handler.seen == 1 and Crossed.paths == []  # no middleware crossed
        # errors raised in the route are answered by the app's own handlers, as through the stack
        handler.raise_next = HTTPException(429, "more than 5 heartbeats a minute")
        limited = client.post("/heartbeat", content=b"{}")
        assert limited.status_code == 429 and limited.json() == {"detail": "more than 5 heartbeats a minute"}
        handler.raise_next = RequestValidationError([{"type": "extra_forbidden", "loc": ("body", "node"),
                                                      "msg": "Extra inputs are not permitted", "input": 1}])
        invalid = client.post("/heartbeat", content=b"{}")
        assert invalid.status_code == 422 and invalid.json()["detail"][0]["loc"] == ["body", "node"]
        handler.raise_next = RuntimeError("boom")
        broken = client.post("/heartbeat", content=b"{}")
        assert broken.status_code == 500 and "RuntimeError" in broken.json()["detail"]
        # any other method on the path, and every other route, take the stack
        assert client.get("/heartbeat").status_code == 405
        assert client.get("/ping").json() == {"pong": "yes"}
        assert Crossed.paths == ["GET /heartbeat", "GET /ping"]
        # one route for the path, documented with its request schema
        post = client.get("/openapi.json").json()["paths"]["/heartbeat"]["post"]
        assert post["requestBody"]["content"]["application/json"]["schema"]["title"] == "HeartbeatRequest"


def test_a_hot_route_must_leave_fastapi_nothing_to_solve() -> None:
    router = APIRouter()

    def token(request: Request) -> str:
        return "t"

    @router.post("/beat")
    async def beat(request: Request, caller: Annotated[str, Depends(token)]) -> Response:
        return Response()

    with pytest.raises(TypeError, match="nothing for FastAPI to solve"):
        OrchestratorApp().include_hot_router(router)
