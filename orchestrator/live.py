"""Redis side of the node lifecycle: what expires or changes every heartbeat, shared by replicas.

Keys (all under `orch:{<pool_id>}:`; the braces are a Redis Cluster hash tag, so one pool's keys share
a slot and the heartbeat script may touch several of them atomically):
  state          hash  address → NodeState, for nodes allowed to heartbeat (mirror of SQL)
  seen           zset  address → unix time of the last heartbeat (liveness; one ZRANGEBYSCORE finds the stale)
  hb:{address}   hash  last task status JSON, metrics JSON, worker version; expires after the TTL
  tasks:version  int   bumped on every task or assignment change; replicas reload their plan on change
  leader         str   which replica runs the background loops
  nonce:{address}:{nonce}   single-use request nonces (kept twice the accepted clock skew)
  rate:{address}:{minute}   heartbeats per address per minute
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from redis.asyncio import Redis

from intellect.wire.heartbeat import TaskStatus
from intellect.wire.nodes import NodeState
from orchestrator.script_channel import ScriptChannel


def as_text(value: bytes | str) -> str:
    """A Redis reply as text: bytes from a client without decode_responses, str from one with it."""
    return value.decode() if isinstance(value, bytes) else value

class LiveStore:
    def __init__(self, redis: Redis, pool_id: int, ttl_seconds: float) -> None:
        self.redis = redis
        self.prefix = f"orch:{{{pool_id}}}"
        self.ttl = ttl_seconds
        self.state_key = f"{self.prefix}:state"
        self.seen_key = f"{self.prefix}:seen"
        self.version_key = f"{self.prefix}:tasks:version"
        self.leader_key = f"{self.prefix}:leader"
        self._beat = redis.register_script(_BEAT)  # EVALSHA, reloaded by redis-py on NOSCRIPT
        # The hot path: the same script over one pipelined connection, without redis-py's per-call work.
        self._channel = ScriptChannel(redis, _BEAT) if ScriptChannel.usable(redis) else None
        # redis-py's asyncio pool raises (not waits) past its 100 connections: under a burst, heartbeats
        # queue here for a connection instead of failing with a 500, leaving room for the other users.
        self._beat_slots = asyncio.Semaphore(64)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()

    def hb_key(self, address: str) -> str:
        return f"{self.prefix}:hb:{address}"

    async def record_beat(self, address: str, nonce: str, *, nonce_ttl: int, rate_limit: int, now: float,
                          task_json: str, metrics_json: str, worker_version: str) -> Beat:
        """Claim the nonce, count the rate, check the state, write liveness: one atomic round trip.

        Nothing is written for a replayed, rate-limited, unknown, banned or ejected caller.
        """
        minute = int(now) // 60
        keys = [f"{self.prefix}:nonce:{address}:{nonce}", f"{self.prefix}:rate:{address}:{minute}",
                self.state_key, self.version_key, self.hb_key(address), self.seen_key]
        args = [address, str(nonce_ttl), str(rate_limit), repr(now), task_json, metrics_json, worker_version,
                str(int(self.ttl) + 1)]
        async with self._beat_slots:
            if self._channel is not None:
                reply = await self._channel.call(keys, args)
            else:
                reply = await self._beat(keys=keys, args=args)
        outcome = reply[0].decode()
        state = NodeState(reply[1].decode()) if len(reply) > 1 and reply[1] else None
        if outcome != "ok":
            return Beat(outcome, state)
        return Beat(outcome, state, int(reply[2] or 0), reply[3] or b"")

    async def set_state(self, address: str, state: NodeState | None) -> None:
        if state is None:
            await self.redis.hdel(self.state_key, address)
        else:
            await self.redis.hset(self.state_key, address, state.value)

    async def set_states(self, states: dict[str, NodeState | None]) -> None:
        """Several `set_state`s in one round trip (the invite pass, after reconciling many rows)."""
        if not states:
            return
        pipe = self.redis.pipeline(transaction=False)
        gone = [address for address, state in states.items() if state is None]
        if gone:
            pipe.hdel(self.state_key, *gone)
        if len(gone) < len(states):
            pipe.hset(self.state_key, mapping={a: s.value for a, s in states.items() if s is not None})
        await pipe.execute()

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

    async def stale(self, cutoff: float) -> set[str]:
        """Nodes whose last heartbeat is older than `cutoff` (unix time): the only ones a liveness check
        needs to look at among the Healthy (a range read on the `seen` sorted set)."""
        found = await self.redis.zrangebyscore(self.seen_key, "-inf", f"({cutoff!r}")
        return {as_text(a) for a in found if isinstance(a, bytes | str)}  # members only: no scores asked

    async def forget_seen(self, address: str) -> None:
        await self.redis.zrem(self.seen_key, address)

    async def heartbeat_details(self, address: str) -> tuple[TaskStatus | None, dict[str, float], str | None]:
        raw = await self.redis.hgetall(self.hb_key(address))
        data = {as_text(k): as_text(v) for k, v in raw.items()}
        task = TaskStatus.model_validate_json(data["task"]) if data.get("task") else None
        metrics = json.loads(data["metrics"]) if data.get("metrics") else {}
        return task, metrics, data.get("version") or None


@dataclass(frozen=True)
class Beat:
    """What the heartbeat script found: outcome ok | replayed | rate_limited | unknown | refused."""

    outcome: str
    state: NodeState | None
    version: int = 0
    previous_task: bytes = b""


# KEYS: nonce, rate, state, version, hb, seen. ARGV: address, nonce ttl, rate limit, now, task JSON,
# metrics JSON, worker version, hb ttl. Checks in the order a caller should learn about them.
_BEAT = """
if not redis.call('set', KEYS[1], '1', 'NX', 'EX', ARGV[2]) then return {'replayed'} end
local count = redis.call('incr', KEYS[2])
if count == 1 then redis.call('expire', KEYS[2], 120) end
if count > tonumber(ARGV[3]) then return {'rate_limited'} end
local state = redis.call('hget', KEYS[3], ARGV[1])
if not state then return {'unknown'} end
if state == 'Banned' or state == 'Ejected' then return {'refused', state} end
local previous = redis.call('hget', KEYS[5], 'task') or ''
redis.call('zadd', KEYS[6], ARGV[4], ARGV[1])
redis.call('hset', KEYS[5], 'task', ARGV[5], 'metrics', ARGV[6], 'version', ARGV[7])
redis.call('expire', KEYS[5], ARGV[8])
return {'ok', state, redis.call('get', KEYS[4]) or '0', previous}
"""


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
        if as_text(await self.redis.get(self.key) or b"") == self.holder:
            await self.redis.delete(self.key)


def now() -> float:
    return time.time()
