"""The heartbeat script's pipelined Redis connection (orchestrator/script_channel.py), on a real Redis."""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from intellect.net import free_port
from intellect.redis_server import EmbeddedRedis
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


def test_calls_made_while_the_connection_opens_wait_for_auth_and_select() -> None:
    """Fifty calls, one each loop turn from the first, on a fresh channel to a password-protected Redis,
    database 3: every one runs in database 3 (a call written between AUTH and SELECT would run in 0)."""
    with EmbeddedRedis() as server:
        admin = redis.Redis.from_url(server.url)
        admin.script_load(ECHO)  # cached: each call's first try (EVALSHA) runs straight away
        admin.config_set("requirepass", "s3cret")
        base = f"redis://:s3cret@127.0.0.1:{server.port}"

        async def main() -> None:
            client = Redis.from_url(base + "/3")
            channel = ScriptChannel(client, ECHO)
            try:
                calls = []
                for i in range(50):  # one new call each loop turn, through the whole opening
                    calls.append(asyncio.create_task(channel.call([f"auth:{i}", "auth:n"], [str(i)])))
                    await asyncio.sleep(0)
                await asyncio.gather(*calls)
            finally:
                channel.close()
                await client.aclose()

        asyncio.run(main())
        assert redis.Redis.from_url(base + "/3").get("auth:n") == b"50"
        assert redis.Redis.from_url(base + "/0").dbsize() == 0


class CountingTransport(asyncio.Transport):
    """The channel's transport, counting the writes made to it."""

    def __init__(self, inner: asyncio.Transport) -> None:
        super().__init__()
        self.inner, self.writes = inner, 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes += 1
        self.inner.write(data)

    def close(self) -> None:
        self.inner.close()


def test_the_calls_of_one_loop_turn_go_out_in_one_write(redis_url: str) -> None:
    async def main() -> tuple[list[list[bytes]], int]:
        client = Redis.from_url(redis_url)
        channel = ScriptChannel(client, ECHO)
        try:
            await channel.call(["turn:warm", "turn:n0"], ["warm"])  # opens the connection, caches the script
            assert channel.transport is not None
            counting = CountingTransport(channel.transport)
            channel.transport = counting
            replies = await asyncio.gather(*(channel.call([f"turn:{i}", "turn:n"], [f"v{i}"])
                                             for i in range(200)))
            return replies, counting.writes
        finally:
            channel.close()
            await client.aclose()

    replies, writes = asyncio.run(main())
    assert [r[0] for r in replies] == [f"v{i}".encode() for i in range(200)]
    assert writes == 1


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
