"""Slow links on one machine: a TCP relay that holds every chunk it forwards for a set one-way delay.

Why a relay: this machine's kernel has no `netem` (no `tc qdisc … delay`), and the pipeline's members,
the devnet's hosts and the benches all speak TCP, so a relay placed in front of a listener (the member
dials the relay; the relay dials the real inbox) delays a link without touching either end. Each
direction of each connection is delayed on its own: a chunk read at t is written at
t + delay (+ jitter), never before the chunk read before it (TCP delivers in order, so a held chunk
holds the ones behind it, as a real path's queue does).

What it models and what it does not:
- one-way propagation delay, with optional jitter (uniform in [0, jitter]) and loss: a "lost" chunk is
  delivered one retransmission timeout later (max(200 ms, 3 × delay), Linux's floor), with the
  head-of-line blocking a retransmission causes, since a TCP stream cannot lose bytes;
- not bandwidth, and not the sender's congestion window: the relay acknowledges at once on its own
  side, so a sender is never held by the delay's bandwidth-delay product. A pipeline's activations are
  a few kB a token, far below any window, so latency is what matters for them.
Accuracy (requested vs measured one-way delay, on this machine): `bench/links.py`, docs/pipeline.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from intellect.net import free_port

CHUNK = 64 * 1024
HELD_CHUNKS = 1024  # per direction (≤ 64 MiB held): past that the relay stops reading (back-pressure)
MIN_RTO = 0.2  # seconds: Linux's minimum retransmission timeout

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|us)?\s*$")


def parse_duration(text: str) -> float:
    """'50ms', '0.05s', '50' (ms) → seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"not a duration: {text!r} (want e.g. 50ms, 0.05s or 50)")
    value, unit = float(match.group(1)), match.group(2) or "ms"
    return value / {"us": 1e6, "ms": 1e3, "s": 1.0}[unit]


@dataclass(frozen=True)
class LinkShape:
    """One hop's shape: one-way `delay` and `jitter` in seconds, `loss` a probability per chunk."""

    delay: float
    jitter: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        if self.delay < 0 or self.jitter < 0 or not 0 <= self.loss < 1:
            raise ValueError(f"a link needs delay ≥ 0, jitter ≥ 0 and 0 ≤ loss < 1, not {self}")

    @classmethod
    def parse(cls, delay: str, jitter: str = "0", loss: float = 0.0) -> LinkShape:
        return cls(parse_duration(delay), parse_duration(jitter), loss)

    def hold(self, draw: random.Random) -> float:
        """How long one chunk is held: the delay, a jitter draw, a retransmission if it is 'lost'."""
        held = self.delay + (draw.uniform(0, self.jitter) if self.jitter else 0.0)
        if self.loss and draw.random() < self.loss:
            held += max(MIN_RTO, 3 * self.delay)
        return held

    def __str__(self) -> str:
        text = f"{self.delay * 1e3:g} ms"
        if self.jitter:
            text += f" + up to {self.jitter * 1e3:g} ms"
        return text + (f", {self.loss:.1%} loss" if self.loss else "")


class DelayRelay:
    """Listens on `listen` (host, port; port 0: a free one) and forwards every connection to `target`,
    each direction held for `shape`. Runs its own event loop in a daemon thread: `start()`, `stop()`."""

    def __init__(self, target: tuple[str, int], shape: LinkShape, listen: tuple[str, int] = ("127.0.0.1", 0),
                 seed: int | None = None, log: Callable[[str], None] | None = None) -> None:  # fmt: skip
        self.target, self.shape = target, shape
        self.log = log  # told of each connection it relays (the program prints it: the devnet's logs)
        self.host, self.port = listen[0], listen[1] or free_port()
        self.draw = random.Random(seed)
        self.connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> DelayRelay:
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                serving = asyncio.start_server(self._accept, self.host, self.port)
                self._server = loop.run_until_complete(serving)
            except OSError as exc:
                failed.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name=f"delay-relay-{self.port}", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failed:
            raise failed[0]
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            return

        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(shut(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> DelayRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()  # nothing listens behind the relay: the caller sees the connection drop
            return
        if self.log is not None:
            peer = writer.get_extra_info("peername")
            self.log(f"relaying a connection from {peer[0]}:{peer[1]}" if peer else "relaying a connection")
        task = asyncio.get_running_loop().create_task(self._both(reader, writer, up_reader, up_writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _both(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> None:  # fmt: skip
        """Both directions until each has ended (a half-closed side still gets its answer), then close."""
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                with contextlib.suppress(Exception):
                    w.close()

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue(HELD_CHUNKS)

        async def feed() -> None:
            last = 0.0
            try:
                while chunk := await source.read(CHUNK):
                    last = max(loop.time() + self.shape.hold(self.draw), last)  # in order, as TCP is
                    await held.put((last, chunk))
            except (ConnectionError, OSError):
                pass
            await held.put((max(loop.time() + self.shape.delay, last), None))

        feeding = loop.create_task(feed())
        try:
            while True:
                due, chunk = await held.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if chunk is None:
                    if sink.can_write_eof():
                        sink.write_eof()
                    return
                sink.write(chunk)
                await sink.drain()
        except (ConnectionError, OSError):
            sink.close()  # the other side went away: so does this one (the other direction ends too)
        finally:
            feeding.cancel()


def main(argv: list[str] | None = None) -> None:
    """`python -m intellect.links --listen HOST:PORT --target HOST:PORT --delay 50ms [--jitter 5ms]
    [--loss 0.01]`: one relay in the foreground (in a host's namespace, in front of a peer inbox) until
    interrupted."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog="python -m intellect.links", description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT the relay listens on")
    parser.add_argument("--target", required=True, help="HOST:PORT it forwards to")
    parser.add_argument("--delay", required=True, help="one-way delay, e.g. 50ms")
    parser.add_argument("--jitter", default="0", help="up to this much more, e.g. 5ms")
    parser.add_argument("--loss", type=float, default=0.0, help="probability a chunk is held one RTO more")
    args = parser.parse_args(argv)
    try:
        shape = LinkShape.parse(args.delay, args.jitter, args.loss)
        (lhost, _, lport), (thost, _, tport) = args.listen.rpartition(":"), args.target.rpartition(":")
        relay = DelayRelay((thost, int(tport)), shape, listen=(lhost, int(lport)),
                           log=lambda line: print(line, flush=True))  # fmt: skip
    except ValueError as exc:
        parser.error(str(exc))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with relay:
        print(f"relaying {relay.address} → {args.target}, {shape} each way", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()


if __name__ == "__main__":
    main()
