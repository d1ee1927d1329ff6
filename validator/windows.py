"""How long after a submission this pool's validators may still vote on it (the pool's slashing
policy window, or the contract's global invalidation window for a pool without a policy), read from
the chain and cached. The judge loop needs it to act before the deadline: a withheld file must be
invalidated, and an unreachable one soft-invalidated, while a vote can still land (the contract keeps
every reward locked at least that long, so nothing is paid before)."""

from __future__ import annotations

import threading
import time

from ledger.client import LedgerClient


class VoteWindows:
    def __init__(self, client: LedgerClient, ttl: float = 60.0) -> None:
        self.client = client
        self.ttl = ttl
        self._cache: dict[int, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def seconds(self, pool_id: int) -> int:
        with self._lock:
            hit = self._cache.get(pool_id)
            if hit and hit[0] > time.monotonic():
                return hit[1]
        policy = self.client.slashing.policy(pool_id)
        window = policy.window_seconds if policy.quorum else self.client.work_parameters().invalidation_window
        with self._lock:
            self._cache[pool_id] = (time.monotonic() + self.ttl, int(window))
        return int(window)
