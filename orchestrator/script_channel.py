"""One Redis script, called over one pipelined connection: the heartbeat's round trip without a pool.

Profiled in process (orchestrator/heartbeat.py driven through ASGI, real Redis; `bench/heartbeats.py`
says where the CPU of a whole server goes), redis-py's asyncio client spent about a third of a
heartbeat's CPU around the script call rather than in it: packing 14 arguments through its generic
encoder (~150 `isinstance` calls a command), taking and returning a pooled connection, a timeout wrapper
and its observability hooks. A heartbeat needs none of that: the arguments are already strings, and
every call is the same EVALSHA.

`ScriptChannel` keeps one connection per process; calls from concurrent heartbeats are pipelined,
never serialized. The calls made in one turn of the event loop go out in one write at the end of it:
a write to a loopback socket is a system call that also runs Redis's side of the receive (about a
tenth of an API process's samples at 1,000 beats a second, py-spy), and under load many calls share a
turn. Replies come back in order, parsed by hiredis (the C parser redis-py itself uses) and handed
to the calls in the order they were written. A connection is used only once its AUTH and SELECT are
answered, so no call can run in another database. A script the server does not have (NOSCRIPT: a
restarted or flushed Redis) is sent once in full with EVAL, which also caches it. Failures keep
redis-py's types, so the app answers them as for any Redis error (503 with a reason): a lost
connection fails the calls in flight (and those not yet written) with ConnectionError, and the next
call opens a new connection. TLS connections (`rediss://`) are left to redis-py.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
from typing import Any

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError


def encode(*parts: bytes) -> bytes:
    """One command in RESP: an array of bulk strings."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


class _Reply(asyncio.Protocol):
    """Feeds the connection's bytes to hiredis and resolves the waiting calls in order."""

    def __init__(self, channel: ScriptChannel) -> None:
        self.channel = channel
        self.reader = hiredis.Reader(replyError=ResponseError)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        pending = self.channel.pending
        while (reply := self.reader.gets()) is not False:
            if not pending:
                continue  # a reply nobody waits for (the connection is being closed): dropped
            future = pending.popleft()
            if future.done():
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.channel.lost(exc)


class ScriptChannel:
    """EVALSHA of one Lua script over a single pipelined connection to the Redis that `redis` uses."""

    def __init__(self, redis: Redis, script: str) -> None:
        kwargs: dict[str, Any] = dict(redis.connection_pool.connection_kwargs)
        self.path: str | None = kwargs.get("path")
        self.host: str = kwargs.get("host", "localhost")
        self.port: int = int(kwargs.get("port", 6379))
        self.db = int(kwargs.get("db", 0) or 0)
        self.username: str | None = kwargs.get("username")
        self.password: str | None = kwargs.get("password")
        self.script = script.encode()
        self.sha = hashlib.sha1(self.script).hexdigest().encode()
        self.pending: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self._opening = asyncio.Lock()
        self._outbox: list[bytes] = []  # commands of this loop turn, written together by `_flush`

    @staticmethod
    def usable(redis: Redis) -> bool:
        """Plain TCP or a unix socket: what this channel speaks (TLS and the rest stay with redis-py)."""
        return redis.connection_pool.connection_class in (Connection, UnixDomainSocketConnection)

    async def call(self, keys: list[str], args: list[str]) -> Any:
        parts = [str(len(keys)).encode(), *(k.encode() for k in keys), *(a.encode() for a in args)]
        try:
            return await self._send(encode(b"EVALSHA", self.sha, *parts))
        except ResponseError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
            return await self._send(encode(b"EVAL", self.script, *parts))

    async def _send(self, command: bytes) -> Any:
        if self.transport is None:
            await self._open()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self.pending.append(future)  # queued and written in this order: replies come back in it
        self._outbox.append(command)
        if len(self._outbox) == 1:
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        commands, self._outbox = self._outbox, []
        if commands and self.transport is not None:
            self.transport.write(b"".join(commands))

    async def _open(self) -> asyncio.Transport:
        async with self._opening:
            if self.transport is not None:
                return self.transport
            loop = asyncio.get_running_loop()
            try:
                if self.path:
                    transport, _ = await loop.create_unix_connection(lambda: _Reply(self), self.path)
                else:
                    transport, _ = await loop.create_connection(lambda: _Reply(self), self.host, self.port)
            except OSError as exc:
                raise RedisConnectionError(f"cannot reach Redis at {self._where()}: {exc}") from exc
            try:  # AUTH and SELECT answered before any call may use the connection
                for command in self._handshake():
                    future: asyncio.Future[Any] = loop.create_future()
                    self.pending.append(future)
                    transport.write(command)
                    await future
            except BaseException:  # a refused AUTH or SELECT: never leave a half-set-up connection in use
                transport.close()
                raise
            self.transport = transport
            return transport

    def _handshake(self) -> list[bytes]:
        out = []
        if self.password:
            user = [self.username.encode()] if self.username else []
            out.append(encode(b"AUTH", *user, self.password.encode()))
        if self.db:
            out.append(encode(b"SELECT", str(self.db).encode()))
        return out

    def _where(self) -> str:
        return self.path or f"{self.host}:{self.port}"

    def lost(self, exc: Exception | None) -> None:
        """The connection closed: every call still waiting fails; the next call reconnects."""
        self.transport = None
        self._outbox = []  # their calls fail below; never send them on the next connection
        reason = f"connection to Redis at {self._where()} lost" + (f": {exc}" if exc else "")
        error = RedisConnectionError(reason)
        while self.pending:
            future = self.pending.popleft()
            if not future.done():
                future.set_exception(error)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
