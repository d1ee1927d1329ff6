"""Server side of signed requests for FastAPI: nonce single-use, per-address rate limits, admin tokens.

Services build one `RequestVerifier` at start-up and depend on `verifier.dependency` in routes:

    verifier = RequestVerifier(RedisNonceStore(redis), RedisRateLimiter(redis, 20, 1.0))
    @app.post("/heartbeat")
    async def heartbeat(body: HeartbeatRequest, caller: str = Depends(verifier.dependency)): ...
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from pathlib import Path
from typing import Protocol

from fastapi import HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis.asyncio import Redis

from intellect.signing import DEFAULT_MAX_SKEW_SECONDS, SignatureRejected, verify_signed_request


class NonceStore(Protocol):
    async def claim(self, address: str, nonce: str, ttl_seconds: int) -> bool:
        """True the first time (address, nonce) is seen within ttl; False on a replay."""


class RateLimiter(Protocol):
    async def allow(self, key: str) -> bool: ...


class RedisNonceStore:
    """Nonces in Redis, shared by every replica behind a load balancer."""

    def __init__(self, redis: Redis, prefix: str = "nonce") -> None:
        self.redis = redis
        self.prefix = prefix

    async def claim(self, address: str, nonce: str, ttl_seconds: int) -> bool:
        return bool(await self.redis.set(f"{self.prefix}:{address}:{nonce}", 1, nx=True, ex=ttl_seconds))


class MemoryNonceStore:
    """For single-process endpoints (a worker's own API) where no Redis runs."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    async def claim(self, address: str, nonce: str, ttl_seconds: int) -> bool:
        now = time.monotonic()
        key = f"{address}:{nonce}"
        with self._lock:
            if len(self._seen) > 10_000:
                self._seen = {k: exp for k, exp in self._seen.items() if exp > now}
            if self._seen.get(key, 0) > now:
                return False
            self._seen[key] = now + ttl_seconds
            return True


class RedisRateLimiter:
    """Fixed-window counter per key in Redis: at most `limit` requests per `window_seconds`."""

    def __init__(self, redis: Redis, limit: int, window_seconds: float, prefix: str = "rate") -> None:
        self.redis = redis
        self.limit = limit
        self.window = max(1, int(window_seconds))
        self.prefix = prefix

    async def allow(self, key: str) -> bool:
        bucket = int(time.time()) // self.window
        name = f"{self.prefix}:{key}:{bucket}"
        pipe = self.redis.pipeline(transaction=False)
        pipe.incr(name)
        pipe.expire(name, self.window * 2)
        count, _ = await pipe.execute()
        return int(count) <= self.limit


class NoRateLimit:
    async def allow(self, key: str) -> bool:
        return True


def raw_path_with_query(request: Request) -> str:
    """The request target as the client sent it (undecoded), which is what the client signed."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    query = request.scope.get("query_string", b"")
    target = raw.decode("latin-1")
    return f"{target}?{query.decode('latin-1')}" if query else target


class RequestVerifier:
    """Verifies signature, clock skew, nonce single-use and rate limit; yields the caller's address."""

    def __init__(
        self,
        nonces: NonceStore,
        limiter: RateLimiter | None = None,
        max_skew_seconds: int = DEFAULT_MAX_SKEW_SECONDS,
    ) -> None:
        self.nonces = nonces
        self.limiter = limiter or NoRateLimit()
        self.max_skew_seconds = max_skew_seconds

    async def verify(self, request: Request) -> str:
        body = await request.body()
        try:
            signed = verify_signed_request(
                request.method,
                raw_path_with_query(request),
                body,
                request.headers,
                max_skew_seconds=self.max_skew_seconds,
            )
        except SignatureRejected as exc:
            raise HTTPException(status_code=exc.status, detail=exc.reason) from None
        # Kept for twice the skew window: a nonce can never be replayed while its timestamp is valid.
        if not await self.nonces.claim(signed.address, signed.nonce, 2 * self.max_skew_seconds + 1):
            raise HTTPException(status_code=401, detail="nonce already used (replayed request)")
        if not await self.limiter.allow(signed.address):
            raise HTTPException(status_code=429, detail="rate limit exceeded for this address")
        return signed.address

    async def dependency(self, request: Request) -> str:
        return await self.verify(request)


_bearer = HTTPBearer(auto_error=False)


def load_or_create_admin_token(path: Path) -> str:
    """The admin bearer token: generated on first start, stored with mode 0600, never a default."""
    import os

    if path.exists():
        token = path.read_text().strip()
        if token:
            return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token


def read_admin_token(path: Path, service: str) -> str:
    """The token a service created on its first start, for a command run beside it. Never creates one:
    a fresh token in a mistyped folder would be one the running service refuses."""
    try:
        token = path.read_text().strip()
    except OSError:
        token = ""
    if not token:
        raise ValueError(
            f"no {service} state in {path.parent} (no {path.name} file there): give the running "
            f"{service}'s --state-dir"
        )
    return token


class AdminToken:
    """FastAPI dependency checking `Authorization: Bearer <token>` in constant time."""

    def __init__(self, token: str) -> None:
        if len(token) < 16:
            raise ValueError("admin token too short: generate one with load_or_create_admin_token")
        self.token = token

    async def __call__(self, request: Request) -> None:
        creds: HTTPAuthorizationCredentials | None = await _bearer(request)
        if creds is None:
            raise HTTPException(
                status_code=401, detail="admin bearer token required", headers={"WWW-Authenticate": "Bearer"}
            )
        if not hmac.compare_digest(creds.credentials, self.token):
            raise HTTPException(status_code=403, detail="wrong admin token")
