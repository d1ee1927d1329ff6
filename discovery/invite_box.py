"""Invites waiting for nodes that nobody can call (behind NAT, no open port): one per node, in Redis.

A pool's orchestrator invites a node by calling the node's own HTTP API; a node behind a home router
has none that anyone outside can reach. So the orchestrator also leaves the signed invite here, and
the node, which already talks to discovery to publish its metadata, fetches it and joins exactly as if
it had been called. The value expires with the invite (its on-chain expiration).
"""

from __future__ import annotations

import time

from redis.asyncio import Redis

from intellect.wire.invites import InviteRequest

PREFIX = "discovery:invite"


class InviteBox:
    """The only writer of the `discovery:invite:*` keys."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    @staticmethod
    def _key(address: str) -> str:
        return f"{PREFIX}:{address}"

    async def put(self, invite: InviteRequest) -> None:
        ttl = max(1, invite.expiration - int(time.time()))
        await self.redis.set(self._key(invite.node_address), invite.model_dump_json(), ex=ttl)

    async def get(self, address: str) -> InviteRequest | None:
        raw = await self.redis.get(self._key(address))
        return InviteRequest.model_validate_json(raw) if raw else None

    async def delete(self, address: str) -> None:
        await self.redis.delete(self._key(address))
