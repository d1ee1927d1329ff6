"""The heartbeat script's pipelined Redis connection (orchestrator/script_channel.py), on a real Redis."""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from intellect.net import free_port
from orchestrator.script_channel import ScriptChannel, encode

ECHO = "redis.call('set', KEYS[1], ARGV[1]) return {ARGV[1], redis.call('incr', KEYS[2])}"


def test_resp_encoding_is_an_array_of_bulk_strings() -> None:
    assert encode(b"GET", b"k") == b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
    assert encode(b"SET", b"k", b"") == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"


def test_concurrent_calls_each_get_their_own_reply(redis_url: str) -> None:
    async def main() -> list[list[bytes]]:
        client = Redis.from_url(redis_url)
        channel = ScriptChannel(client, ECHO)
        try:
            calls = (channel.call([f"echo:{i}", "echo:count"], [f"v{i}"]) for i in range(300))
            return await asyncio.gather(*calls)
        finally:
            channel.close()
            await client.aclose()

    replies = asyncio.run(main())
    assert [r[0] for r in replies] == [f"v{i}".encode() for i in range(300)]
    assert sorted(r[1] for r in replies) == list(range(1, 301))  # every call ran once, atomically
    sync = redis.Redis.from_url(redis_url)
    assert sync.get("echo:299") == b"v299"


def test_a_flushed_script_cache_and_a_dropped_connection_are_survived(redis_url: str) -> None:
    sync = redis.Redis.from_url(redis_url)

    async def main() -> tuple[list[bytes], list[bytes]]:
        client = Redis.from_url(redis_url)
        channel = ScriptChannel(client, ECHO)
        try:
            sync.script_flush()  # NOSCRIPT: sent once in full, which caches it again
            first = await channel.call(["flush:a", "flush:n"], ["a"])
            assert sync.script_exists(channel.sha.decode()) == [True]
            sync.client_kill_filter(_type="normal", skipme=True)  # the server drops our connection
            await asyncio.sleep(0.2)
            second = await channel.call(["flush:b", "flush:n"], ["b"])  # a new connection
            return first, second
        finally:
            channel.close()
            await client.aclose()

    first, second = asyncio.run(main())
    assert first == [b"a", 1] and second == [b"b", 2]


def test_the_database_of_the_url_is_the_one_written(redis_url: str) -> None:
    async def main() -> None:
        client = Redis.from_url(redis_url.rsplit("/", 1)[0] + "/3")
        channel = ScriptChannel(client, ECHO)
        try:
            await channel.call(["db:key", "db:n"], ["in three"])
        finally:
            channel.close()
            await client.aclose()

    asyncio.run(main())
    base = redis_url.rsplit("/", 1)[0]
    assert redis.Redis.from_url(base + "/3").get("db:key") == b"in three"
    assert redis.Redis.from_url(base + "/0").get("db:key") is None


def test_errors_keep_redis_types() -> None:
    async def main() -> None:
        client = Redis(host="127.0.0.1", port=free_port())  # nothing listens there
        channel = ScriptChannel(client, ECHO)
        with pytest.raises(RedisConnectionError, match="cannot reach Redis"):
            await channel.call(["k", "n"], ["v"])
        await client.aclose()

    asyncio.run(main())


def test_a_script_error_is_a_response_error(redis_url: str) -> None:
    async def main() -> None:
        client = Redis.from_url(redis_url)
        channel = ScriptChannel(client, "return redis.call('incr', KEYS[1])")
        redis.Redis.from_url(redis_url).set("not-a-number", "x")
        try:
            with pytest.raises(ResponseError, match="not an integer"):
                await channel.call(["not-a-number"], [])
            assert await channel.call(["a-number"], []) == 1  # the connection stays usable
        finally:
            channel.close()
            await client.aclose()

    asyncio.run(main())


def test_tls_connections_are_left_to_redis_py() -> None:
    assert ScriptChannel.usable(Redis(host="127.0.0.1", port=6379))
    assert ScriptChannel.usable(Redis(unix_socket_path="/tmp/redis.sock"))
    assert not ScriptChannel.usable(Redis.from_url("rediss://127.0.0.1:6380"))
