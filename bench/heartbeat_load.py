"""The load generator of bench/heartbeats.py: client processes that play heartbeating workers.

Every request is signed ahead of its run (signing costs about as much CPU as verifying and would
otherwise compete with the server on the same cores), then sent open loop at a fixed rate, or closed
loop as fast as answers come (saturation). Latency counts from each request's scheduled send time.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import time
from collections.abc import Iterable
from dataclasses import dataclass

from intellect.identity import Wallet
from intellect.signing import sign_request

BODY = b'{"metrics":{"tokens_per_s":123.0},"worker_version":"0.1.0"}'


@dataclass
class ClientJob:
    url: str
    path: str
    keys: list[str]           # private keys of the nodes this client plays
    count: int                # requests to send (open loop) or to pre-sign (closed loop)
    rate: float               # requests per second of this client (open loop)
    keep_alive: bool
    concurrency: int = 0      # > 0: closed loop for `seconds`, as fast as answers come
    seconds: float = 0.0


@dataclass
class ClientResult:
    latencies: list[float]
    errors: dict[str, int]
    cpu_seconds: float
    wall_seconds: float


def _presign(job: ClientJob) -> list[dict[str, str]]:
    wallets = [Wallet.from_key(k) for k in job.keys]
    base = time.time()
    signed = []
    for i in range(job.count):  # timestamped for about when it will be sent, as a live worker would
        ts = int(base + (i / job.rate if job.rate else 0))
        headers = sign_request(wallets[i % len(wallets)], "POST", "/heartbeat", BODY, timestamp=ts)
        signed.append({"Content-Type": "application/json", **headers})
    return signed


class _Exchange(asyncio.Protocol):
    """One HTTP/1.1 request/response on a connection; the reply is read to its Content-Length.

    A deliberately small client: aiohttp costs the load generator ~1.6 ms of CPU per request with a new
    connection each time, which on 2 shared cores would starve the server being measured.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[int] | None = None
        self.closed = False

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        self.transport = transport

    def send(self, payload: bytes) -> asyncio.Future[int]:
        self.buffer.clear()
        self.waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(payload)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head_end = self.buffer.find(b"\r\n\r\n")
        if head_end < 0 or self.waiter is None or self.waiter.done():
            return
        head = bytes(self.buffer[:head_end]).lower()
        at = head.find(b"content-length:")
        length = int(head[at + 15:head.find(b"\r\n", at) if head.find(b"\r\n", at) > 0 else None]) \
            if at >= 0 else 0
        if len(self.buffer) >= head_end + 4 + length:
            self.waiter.set_result(int(self.buffer[9:12]))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection closed before the reply"))


def _request_bytes(job: ClientJob, host: str, headers: dict[str, str]) -> bytes:
    method, body = ("POST", BODY) if job.path == "/heartbeat" else ("GET", b"")
    lines = [f"{method} {job.path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if not job.keep_alive:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _drive(job: ClientJob, payloads: Iterable[bytes]) -> ClientResult:
    latencies: list[float] = []
    errors: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    hostport = job.url.removeprefix("http://")
    host, port = hostport.split(":")
    idle: list[_Exchange] = []

    async def one(payload: bytes, scheduled: float) -> None:
        try:
            conn = idle.pop() if idle else None
            if conn is None or conn.closed:
                _, conn = await loop.create_connection(_Exchange, host, int(port))
            status = await asyncio.wait_for(conn.send(payload), 30)
        except (OSError, TimeoutError) as exc:
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            return
        if job.keep_alive and not conn.closed:
            idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()
        if status != 200:
            errors[str(status)] = errors.get(str(status), 0) + 1
            return
        latencies.append(time.perf_counter() - scheduled)

    cpu0, t0 = time.process_time(), time.perf_counter()
    if job.concurrency:
        stop, shared = t0 + job.seconds, iter(payloads)  # one iterator: each request is sent once

        async def lane() -> None:
            for payload in shared:
                if time.perf_counter() > stop:
                    return
                await one(payload, time.perf_counter())

        await asyncio.gather(*(lane() for _ in range(job.concurrency)))
    else:
        tasks: set[asyncio.Task[None]] = set()
        for i, payload in enumerate(payloads):
            scheduled = t0 + i / job.rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(one(payload, scheduled))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.gather(*list(tasks))
    wall = time.perf_counter() - t0
    for conn in idle:
        if conn.transport is not None:
            conn.transport.close()
    return ClientResult(latencies, errors, time.process_time() - cpu0, wall)


def _client_main(job: ClientJob, ready, go, results) -> None:  # type: ignore[no-untyped-def]
    import uvloop

    host = job.url.removeprefix("http://")
    if job.path == "/heartbeat":  # whole requests, signed and encoded ahead
        payloads: Iterable[bytes] = [_request_bytes(job, host, h) for h in _presign(job)]
    else:
        payloads = itertools.repeat(_request_bytes(job, host, {}))
    ready.put(True)
    go.wait()
    results.put(uvloop.run(_drive(job, payloads)))


class Clients:
    """Load generator processes: they pre-sign while the server starts, then start together on `go()`."""

    def __init__(self, url: str, path: str, keys: list[str], processes: int, *, rate: float = 0.0,
                 count: int = 0, keep_alive: bool, concurrency: int = 0, seconds: float = 0.0) -> None:
        ctx = multiprocessing.get_context("fork")
        self.ready, self.results, self.start = ctx.Queue(), ctx.Queue(), ctx.Event()
        self.procs = [ctx.Process(target=_client_main, daemon=True, args=(
            ClientJob(url, path, keys[i::processes], count // processes, rate / processes, keep_alive,
                      concurrency // processes, seconds), self.ready, self.start, self.results))
            for i in range(processes)]
        for proc in self.procs:
            proc.start()

    def wait_ready(self) -> None:
        for _ in self.procs:
            self.ready.get(timeout=600)

    def go(self) -> list[ClientResult]:
        self.start.set()
        results = [self.results.get(timeout=900) for _ in self.procs]
        for proc in self.procs:
            proc.join(timeout=10)
        return results


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)
