"""Signed requests end to end: a real uvicorn server on loopback, a real Redis for nonces and limits."""

from __future__ import annotations

import time

import httpx
import pytest
from fastapi import Depends, FastAPI, Request
from redis.asyncio import Redis

from intellect.auth import RedisNonceStore, RedisRateLimiter, RequestVerifier
from intellect.identity import Wallet
from intellect.signing import (
    HEADER_ADDRESS,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    SignatureRejected,
    SignedAuth,
    canonical_string,
    sign_request,
    verify_signed_request,
)

from .conftest import ServerThread


def test_canonical_string_layout() -> None:
    text = canonical_string("post", "/a/b?x=1&y=2", b"{}", 1700000000, "n" * 16)
    assert text.split("\n") == [
        "POST",
        "/a/b?x=1&y=2",
        "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
        "1700000000",
        "n" * 16,
    ]


def test_pure_verification_rejects_each_tampered_field() -> None:
    wallet = Wallet.create()
    headers = sign_request(wallet, "POST", "/heartbeat?x=1", b'{"a":1}')
    assert verify_signed_request("POST", "/heartbeat?x=1", b'{"a":1}', headers).address == wallet.address
    for method, path, body in [
        ("GET", "/heartbeat?x=1", b'{"a":1}'),
        ("POST", "/heartbeat?x=2", b'{"a":1}'),
        ("POST", "/heartbeat", b'{"a":1}'),
        ("POST", "/heartbeat?x=1", b'{"a":2}'),
    ]:
        with pytest.raises(SignatureRejected, match="does not match"):
            verify_signed_request(method, path, body, headers)
    impostor = dict(headers, **{HEADER_ADDRESS: Wallet.create().address})
    with pytest.raises(SignatureRejected, match="does not match"):
        verify_signed_request("POST", "/heartbeat?x=1", b'{"a":1}', impostor)


def test_skew_and_malformed_headers() -> None:
    wallet = Wallet.create()
    old = sign_request(wallet, "GET", "/x", timestamp=int(time.time()) - 120)
    with pytest.raises(SignatureRejected, match="max skew 60s"):
        verify_signed_request("GET", "/x", b"", old)
    assert verify_signed_request("GET", "/x", b"", old, max_skew_seconds=300).address == wallet.address
    short_nonce = sign_request(wallet, "GET", "/x", nonce="abc")
    with pytest.raises(SignatureRejected, match="16 to 64") as info:
        verify_signed_request("GET", "/x", b"", short_nonce)
    assert info.value.status == 400
    with pytest.raises(SignatureRejected, match="missing signature headers"):
        verify_signed_request("GET", "/x", b"", {HEADER_NONCE: "a" * 16})
    garbage = dict(sign_request(wallet, "GET", "/x"), **{HEADER_SIGNATURE: "0x1234"})
    with pytest.raises(SignatureRejected, match="0x followed by 130 hex"):
        verify_signed_request("GET", "/x", b"", garbage)


def _app(redis_url: str, limit: int) -> FastAPI:
    app = FastAPI()
    holder: dict[str, RequestVerifier] = {}

    async def caller(request: Request) -> str:
        if "v" not in holder:
            redis = Redis.from_url(redis_url)
            holder["v"] = RequestVerifier(RedisNonceStore(redis), RedisRateLimiter(redis, limit, 60))
        return await holder["v"].verify(request)

    @app.post("/echo")
    async def echo(payload: dict, address: str = Depends(caller)) -> dict:
        return {"address": address, "payload": payload}

    @app.get("/items/{name}")
    async def item(name: str, q: str = "", address: str = Depends(caller)) -> dict:
        return {"address": address, "name": name, "q": q}

    return app


@pytest.fixture
def signed_server(redis_server):
    with ServerThread(_app(redis_server.url, limit=8)) as server:
        yield server


def test_signed_requests_over_http(signed_server) -> None:
    wallet = Wallet.create()
    with httpx.Client(base_url=signed_server.url, auth=SignedAuth(wallet)) as client:
        reply = client.post("/echo", json={"k": "v"})
        assert reply.status_code == 200, reply.text
        assert reply.json() == {"address": wallet.address, "payload": {"k": "v"}}
        # Path parameters and query strings with characters that need escaping are signed as sent.
        reply = client.get("/items/a%20b", params={"q": "x y&z"})
        assert reply.status_code == 200, reply.text
        assert reply.json() == {"address": wallet.address, "name": "a b", "q": "x y&z"}


def test_replay_is_refused_even_from_another_client(signed_server) -> None:
    wallet = Wallet.create()
    body = b'{"k": 1}'
    headers = sign_request(wallet, "POST", "/echo", body) | {"content-type": "application/json"}
    first = httpx.post(signed_server.url + "/echo", content=body, headers=headers)
    assert first.status_code == 200
    replay = httpx.post(signed_server.url + "/echo", content=body, headers=headers)
    assert replay.status_code == 401
    assert "replayed" in replay.json()["detail"]


def test_unsigned_tampered_and_skewed_requests_get_clear_4xx(signed_server) -> None:
    wallet = Wallet.create()
    unsigned = httpx.post(signed_server.url + "/echo", json={})
    assert unsigned.status_code == 401 and "missing signature headers" in unsigned.json()["detail"]

    headers = sign_request(wallet, "POST", "/echo", b'{"a":1}') | {"content-type": "application/json"}
    tampered = httpx.post(signed_server.url + "/echo", content=b'{"a":2}', headers=headers)
    assert tampered.status_code == 401 and "does not match" in tampered.json()["detail"]

    stale = sign_request(wallet, "POST", "/echo", b"{}", timestamp=int(time.time()) - 3600)
    skewed = httpx.post(signed_server.url + "/echo", content=b"{}", headers=stale)
    assert skewed.status_code == 401 and "skew" in skewed.json()["detail"]


def test_rate_limit_is_per_address_and_shared_in_redis(redis_server) -> None:
    noisy, quiet = Wallet.create(), Wallet.create()
    # Two server replicas sharing one Redis: the limit holds across both.
    with (
        ServerThread(_app(redis_server.url, limit=5)) as a,
        ServerThread(_app(redis_server.url, limit=5)) as b,
    ):
        codes = []
        for i in range(8):
            url = (a if i % 2 else b).url
            codes.append(httpx.post(url + "/echo", json={}, auth=SignedAuth(noisy)).status_code)
        assert codes.count(200) == 5 and codes.count(429) == 3
        assert httpx.post(a.url + "/echo", json={}, auth=SignedAuth(quiet)).status_code == 200
