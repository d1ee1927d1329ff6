"""Redis side of the node lifecycle: what expires or changes every heartbeat, shared by replicas.

Keys (all under `orch:{pool_id}:`):
  state          hash  address → NodeState, for nodes allowed to heartbeat (mirror of SQL)
  seen           zset  address → unix time of the last heartbeat (liveness; one ZRANGEBYSCORE finds the stale)
  hb:{address}   hash  last task status JSON, metrics JSON, worker version; expires after the TTL
  tasks:version  int   bumped on every task or assignment change; replicas reload their plan on change
  leader         str   which replica runs the background loops
"""

from __future__ import annotations

import json
import time

from redis.asyncio import Redis

from intellect.wire.heartbeat import TaskStatus
from intellect.wire.nodes import NodeState


class LiveStore:
    def __init__(self, redis: Redis, pool_id: int, ttl_seconds: float) -> None:
        self.redis = redis
        self.prefix = f"orch:{pool_id}"
        self.ttl = ttl_seconds
        self.state_key = f"{self.prefix}:state"
        self.seen_key = f"{self.prefix}:seen"
        self.version_key = f"{self.prefix}:tasks:version"
        self.leader_key = f"{self.prefix}:leader"

    def hb_key(self, address: str) -> str:
        return f"{self.prefix}:hb:{address}"

    async def set_state(self, address: str, state: NodeState | None) -> None:
        if state is None:
            await self.redis.hdel(self.state_key, address)
        else:
            await self.redis.hset(self.state_key, address, state.value)

    async def replace_states(self, states: dict[str, NodeState]) -> None:
        """Rebuild the state mirror from SQL (start-up)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.state_key)
        if states:
            pipe.hset(self.state_key, mapping={a: s.value for a, s in states.items()})
        await pipe.execute()

    async def bump_version(self) -> int:
        return int(await self.redis.incr(self.version_key))

    async def last_seen(self, addresses: list[str]) -> dict[str, float | None]:
        if not addresses:
            return {}
        scores = await self.redis.zmscore(self.seen_key, addresses)
        return dict(zip(addresses, scores, strict=True))

    async def forget_seen(self, address: str) -> None:
        await self.redis.zrem(self.seen_key, address)

    async def heartbeat_details(self, address: str) -> tuple[TaskStatus | None, dict[str, float], str | None]:
        raw = await self.redis.hgetall(self.hb_key(address))
        data = {k.decode(): v.decode() for k, v in raw.items()}
        task = TaskStatus.model_validate_json(data["task"]) if data.get("task") else None
        metrics = json.loads(data["metrics"]) if data.get("metrics") else {}
        return task, metrics, data.get("version") or None


class LeaderLease:
    """At most one replica runs the invite and liveness loops: a Redis key with an expiring lease."""

    _RENEW = (
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end "
        "return redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0"
    )

    def __init__(self, redis: Redis, key: str, holder: str, ttl_seconds: float) -> None:
        self.redis = redis
        self.key = key
        self.holder = holder
        self.ttl_ms = int(ttl_seconds * 1000)

    async def hold(self) -> bool:
        return bool(await self.redis.eval(self._RENEW, 1, self.key, self.holder, self.ttl_ms))

    async def release(self) -> None:
        if (await self.redis.get(self.key) or b"").decode() == self.holder:
            await self.redis.delete(self.key)


def now() -> float:
    return time.time()
