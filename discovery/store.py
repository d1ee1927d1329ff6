"""Discovery records in Redis: one JSON value per node (expiring), an index set, and a set per IP."""

from __future__ import annotations

from redis.asyncio import Redis

from intellect.wire.nodes import DiscoveredNode

PREFIX = "discovery"


class NodeStore:
    def __init__(self, redis: Redis, record_ttl_seconds: int) -> None:
        self.redis = redis
        self.ttl = record_ttl_seconds

    @staticmethod
    def _node_key(address: str) -> str:
        return f"{PREFIX}:node:{address}"

    @staticmethod
    def _ip_key(ip: str) -> str:
        return f"{PREFIX}:ip:{ip}"

    async def get(self, address: str) -> DiscoveredNode | None:
        raw = await self.redis.get(self._node_key(address))
        return DiscoveredNode.model_validate_json(raw) if raw else None

    async def all(self) -> list[DiscoveredNode]:
        addresses = sorted(a.decode() if isinstance(a, bytes) else a
                           for a in await self.redis.smembers(f"{PREFIX}:nodes"))
        if not addresses:
            return []
        raws = await self.redis.mget([self._node_key(a) for a in addresses])
        gone = [a for a, raw in zip(addresses, raws, strict=True) if raw is None]
        if gone:  # records expired: drop them from the index
            await self.redis.srem(f"{PREFIX}:nodes", *gone)
        return [DiscoveredNode.model_validate_json(raw) for raw in raws if raw is not None]

    async def others_at_ip(self, ip: str, address: str) -> list[str]:
        """Live nodes other than `address` whose current record is at `ip` (stale members pruned)."""
        raw = await self.redis.smembers(self._ip_key(ip))
        members = [m.decode() if isinstance(m, bytes) else m for m in raw]
        others = [m for m in members if m != address]
        live: list[str] = []
        for other in others:
            record = await self.get(other)
            if record and record.metadata.ip_address == ip:
                live.append(other)
            else:
                await self.redis.srem(self._ip_key(ip), other)
        return live

    async def put(self, record: DiscoveredNode, previous: DiscoveredNode | None) -> None:
        address = record.metadata.node_address
        pipe = self.redis.pipeline(transaction=True)
        if previous and previous.metadata.ip_address != record.metadata.ip_address:
            pipe.srem(self._ip_key(previous.metadata.ip_address), address)
        pipe.set(self._node_key(address), record.model_dump_json(), ex=self.ttl)
        pipe.sadd(f"{PREFIX}:nodes", address)
        pipe.sadd(self._ip_key(record.metadata.ip_address), address)
        await pipe.execute()

    async def update_flags(self, record: DiscoveredNode) -> None:
        """Rewrite a record after a sync without extending its expiry (only uploads do that)."""
        await self.redis.set(self._node_key(record.metadata.node_address), record.model_dump_json(),
                             keepttl=True, xx=True)
