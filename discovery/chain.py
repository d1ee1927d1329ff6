"""What discovery reads from the ledger, behind a small interface with a TTL cache.

The ledger client is synchronous (web3); callers run these methods in a thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ledger.errors import LedgerError

ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"
T = TypeVar("T")


@dataclass(frozen=True)
class ChainNode:
    provider: str
    compute_units: int
    validated: bool
    pool_id: int | None  # None: in no pool


@dataclass(frozen=True)
class ChainProvider:
    registered: bool
    whitelisted: bool
    blacklisted: bool


@dataclass(frozen=True)
class ChainPool:
    pool_id: int
    domain_id: int
    manager: str
    data_uri: str


class ChainView(Protocol):
    def node(self, address: str) -> ChainNode | None: ...
    def provider(self, address: str) -> ChainProvider | None: ...
    def pool(self, pool_id: int) -> ChainPool | None: ...
    def is_validator(self, address: str) -> bool: ...
    def node_blacklisted(self, pool_id: int, address: str) -> bool: ...


class LedgerChainView:
    """ChainView over `ledger.client.LedgerClient`."""

    def __init__(self, client: object) -> None:
        self.client = client

    def node(self, address: str) -> ChainNode | None:
        try:
            node = self.client.get_node(address)  # type: ignore[attr-defined]
        except LedgerError:
            return None
        if node is None or node.provider == ZERO_ADDRESS:
            return None
        return ChainNode(node.provider, node.compute_units, node.validated, node.active_pool or None)

    def provider(self, address: str) -> ChainProvider | None:
        try:
            p = self.client.get_provider(address)  # type: ignore[attr-defined]
        except LedgerError:
            return None
        if p is None:
            return None
        return ChainProvider(p.registered, p.whitelisted, p.blacklisted)

    def pool(self, pool_id: int) -> ChainPool | None:
        try:
            pool = self.client.get_pool(pool_id)  # type: ignore[attr-defined]
        except LedgerError:
            return None
        if pool is None or pool.manager == ZERO_ADDRESS:
            return None
        return ChainPool(pool.id, pool.domain_id, pool.manager, pool.data_uri)

    def is_validator(self, address: str) -> bool:
        try:
            return bool(self.client.is_validator(address))  # type: ignore[attr-defined]
        except LedgerError:
            return False

    def node_blacklisted(self, pool_id: int, address: str) -> bool:
        check = getattr(self.client, "is_node_blacklisted", None)
        if check is None:
            return False
        try:
            return bool(check(pool_id, address))
        except LedgerError:
            return False


class CachedChainView:
    """Caches pool and role lookups (read on every GET) for `ttl` seconds; node checks stay fresh."""

    def __init__(self, inner: ChainView, ttl: float) -> None:
        self.inner = inner
        self.ttl = ttl
        self._cache: dict[tuple[str, object], tuple[float, object]] = {}
        self._lock = threading.Lock()

    def _cached(self, key: tuple[str, object], load: Callable[[], T]) -> T:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            if hit and hit[0] > now:
                return hit[1]  # type: ignore[return-value]
        value = load()
        with self._lock:
            self._cache[key] = (now + self.ttl, value)
        return value

    def node(self, address: str) -> ChainNode | None:
        return self.inner.node(address)

    def provider(self, address: str) -> ChainProvider | None:
        return self.inner.provider(address)

    def pool(self, pool_id: int) -> ChainPool | None:
        return self._cached(("pool", pool_id), lambda: self.inner.pool(pool_id))

    def is_validator(self, address: str) -> bool:
        return self._cached(("validator", address), lambda: self.inner.is_validator(address))

    def node_blacklisted(self, pool_id: int, address: str) -> bool:
        return self.inner.node_blacklisted(pool_id, address)
