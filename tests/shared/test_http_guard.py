"""The guard every service puts in front of its routes, on a real uvicorn server: bodies over the
limit refused while they stream (before the route reads them), and every error a JSON body."""

from __future__ import annotations

import httpx
import pytest
import redis
from fastapi import FastAPI, Request

from intellect.http_guard import guard, json_safe
from intellect.wire.base import WireModel
from tests.support.testing import ServerThread


class Named(WireModel):
    name: str
    count: int = 0


def make_app(seen: list[int]) -> FastAPI:
    app = FastAPI()

    @app.put("/upload")
    async def upload(request: Request) -> dict[str, int]:
        total = 0
        async for chunk in request.stream():
            total += len(chunk)
        seen.append(total)
        return {"bytes": total}

    @app.put("/big/upload")
    async def big(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    @app.post("/named")
    async def named(body: Named) -> Named:
        return body

    @app.get("/redis")
    async def redis_down() -> None:
        raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:1")

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret internals")

    return guard(
        app,
        max_body=64 * 1024,
        per_path={"/big/": 8 * 1024 * 1024},
        unavailable=[(redis.exceptions.ConnectionError, 503, "redis")],
    )


@pytest.fixture(scope="module")
def server():
    seen: list[int] = []
    with ServerThread(make_app(seen)) as srv:
        srv.seen = seen  # type: ignore[attr-defined]
        yield srv


def chunks(total: int, size: int = 16 * 1024):
    sent = 0
    while sent < total:
        yield b"x" * size
        sent += size


def test_declared_oversize_body_is_refused_before_the_route(server) -> None:
    r = httpx.put(server.url + "/upload", content=b"x" * (65 * 1024))
    assert r.status_code == 413 and "larger than 65536" in r.json()["detail"]
    assert server.seen == []


def test_chunked_oversize_body_is_cut_off_while_streaming(server) -> None:
    before = list(server.seen)
    with httpx.Client(timeout=30) as c:
        try:
            r = c.put(server.url + "/upload", content=chunks(50 * 1024 * 1024))
        except httpx.TransportError:
            r = None  # the server may close the connection while the client is still sending
    if r is not None:
        assert r.status_code == 413 and r.headers["content-type"] == "application/json"
    assert server.seen == before  # the route never finished reading it


def test_small_bodies_and_per_path_limits_pass(server) -> None:
    assert httpx.put(server.url + "/upload", content=b"y" * 1000).json() == {"bytes": 1000}
    r = httpx.put(server.url + "/big/upload", content=b"z" * (1024 * 1024))
    assert r.status_code == 200 and r.json() == {"bytes": 1024 * 1024}


@pytest.mark.parametrize(
    "raw",
    [
        b'{"name": 1e400}',
        b'{"name": "\\ud800"}',
        b'{"name": "ok", "count": 1e400}',
        b'{"name": "ok", "count": NaN}',
        b'{"name": {"\\ud800": [1e999]}}',
        b"\xff\xfe",
    ],
)
def test_hostile_json_gets_a_422_json_body(server, raw: bytes) -> None:
    r = httpx.post(server.url + "/named", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, list) and detail and all("msg" in d for d in detail)


def test_dependency_down_is_503_naming_it(server) -> None:
    r = httpx.get(server.url + "/redis")
    assert r.status_code == 503 and r.json()["detail"].startswith("redis unavailable")


def test_unexpected_errors_are_json_500_without_internals(server) -> None:
    r = httpx.get(server.url + "/boom")
    assert r.status_code == 500
    assert "RuntimeError" in r.json()["detail"] and "secret" not in r.text


def test_json_safe_handles_what_json_cannot() -> None:
    assert json_safe({"a": float("inf"), "b": "\ud800", 3: [float("nan"), b"\xff", ValueError("v")]}) == {
        "a": "inf",
        "b": "\\ud800",
        "3": ["nan", "\\xff", "v"],
    }


DEEP = b"[" * 30_000 + b"]" * 30_000  # 60 KB (under this app's 64 KB limit), one recursion per level


def test_deep_json_is_refused_before_any_parser_sees_it(server) -> None:  # noqa: ANN001
    r = httpx.post(server.url + "/named", content=DEEP, headers={"content-type": "application/json"},
                   timeout=30)  # fmt: skip
    assert r.status_code == 400 and "nested deeper than 64 levels" in r.json()["detail"]
    tricky = b'{"name": "' + b"[" * 1000 + b'\\"]]", "count": 1}'  # brackets inside a string do not nest
    assert httpx.post(server.url + "/named", content=tricky, headers={"content-type": "application/json"},
                      timeout=30).status_code == 200  # fmt: skip
    assert httpx.post(server.url + "/named", json={"name": "x"}, timeout=30).json()["name"] == "x"


@pytest.mark.slow
def test_the_recursion_limit_stays_sane_whatever_a_service_imports() -> None:
    """py_ecc (through eth-account) raises the recursion limit to 100,000 at import; with it, the C JSON
    decoder overflowed the C stack on a deep body and the process died (segfault). A fresh interpreter
    that imports every service still has a sane limit, and a deep body is a RecursionError, not a crash."""
    import subprocess
    import sys

    program = (
        "import sys, json\n"
        "import orchestrator.app, discovery.app, validator.service, validator.api, worker.cli, worker.api\n"
        "import workloads.trainer.step_counter, workloads.broadcast.api, dashboard.server, ledger.cli\n"
        "assert sys.getrecursionlimit() <= 3000, sys.getrecursionlimit()\n"
        "try:\n    json.loads('[' * 100000)\nexcept RecursionError:\n    print('refused')\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert result.stdout.strip() == "refused"
