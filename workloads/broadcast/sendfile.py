"""Shard bodies leave the origin and relays by sendfile(2): the kernel copies page cache to socket.

Why: starlette's FileResponse under uvicorn reads each 1 MiB chunk into a Python `bytes` (a copy, in a
worker thread) and hands it to the transport (a second copy into the socket), with an event-loop
round trip per chunk. On a 2-core host that server work competes with the client's recv + blake3 +
pwrite for the same cores, and a relay is a server and a fetcher at once.

How, with the least of a custom server: uvicorn keeps parsing HTTP and running the FastAPI app (the
store checks, the held requests of a relay, 404/503, metrics all stay in api.py). Our protocol
class advertises the ASGI "zero copy send" extension (`http.response.zerocopysend`, ASGI spec:
extensions) in each request's scope, and its response cycle answers that message with
`loop.sendfile(transport, file, offset, count)`: native sendfile(2) on asyncio's selector loop, which
origins and relays therefore run on (uvloop raises NotImplementedError for it; there, and where the
kernel cannot, 1 MiB reads are written instead). `ShardFile` is the response: a single
`Range` (`bytes=a-b`, `a-`, `-n`) is served as a 206 of exactly those bytes, by sendfile too; under a
server without the extension (a test's plain uvicorn) it streams 1 MiB reads as before.

The extension is in uvicorn's RequestResponseCycle, which its protocol builds by name: after the
protocol built one, `on_headers_complete` turns it into a SendfileCycle (a subclass that only adds a
message type) before the request's task first runs.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any, BinaryIO

from starlette.responses import Response
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from intellect.http_server import HeaderTimeoutProtocol
from intellect.http_server import server_options as base_server_options

ZEROCOPY = "http.response.zerocopysend"
CHUNK = 1 << 20
"""Read size of the fallback path (a server without the extension)."""
RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end exclusive) asked by a single `Range: bytes=...`; None means the whole file (absent,
    unparsable or several ranges, which a server may ignore). Raises ValueError when unsatisfiable."""
    match = RANGE.match((header or "").strip())
    if not match or not (match.group(1) or match.group(2)):
        return None
    first, last = match.group(1), match.group(2)
    if not first:  # a suffix: the last N bytes
        count = min(size, int(last))
        if count == 0:
            raise ValueError("empty suffix range")
        return size - count, size
    start = int(first)
    end = min(size, int(last) + 1) if last else size
    if start >= size or end <= start:
        raise ValueError(f"range {start}-{last} outside a {size}-byte file")
    return start, end


class ShardFile(Response):
    """One shard file (or a single range of it), sent by sendfile where the server offers it."""

    def __init__(self, path: Path | str, range_header: str | None = None) -> None:
        super().__init__(media_type="application/octet-stream")
        self.path = Path(path)
        self.size = os.stat(self.path).st_size
        self.start, self.end = 0, self.size
        self.headers["accept-ranges"] = "bytes"
        try:
            picked = byte_range(range_header, self.size)
        except ValueError:
            self.status_code = 416
            self.start = self.end = 0
            self.headers["content-range"] = f"bytes */{self.size}"
        else:
            if picked is not None:
                self.start, self.end = picked
                self.status_code = 206
                self.headers["content-range"] = f"bytes {self.start}-{self.end - 1}/{self.size}"
        self.headers["content-length"] = str(self.end - self.start)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        count = self.end - self.start
        if scope.get("method") == "HEAD" or count == 0:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        with open(self.path, "rb") as file:
            if ZEROCOPY in scope.get("extensions", {}):
                await send({"type": ZEROCOPY, "file": file, "offset": self.start, "count": count,
                            "more_body": False})  # fmt: skip
                return
            pos = self.start
            while pos < self.end:
                chunk = await asyncio.to_thread(os.pread, file.fileno(), min(CHUNK, self.end - pos), pos)
                if not chunk:
                    raise OSError(f"{self.path} shrank under a response at byte {pos}")
                pos += len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": pos < self.end})


class SendfileCycle(RequestResponseCycle):
    """uvicorn's response cycle plus `http.response.zerocopysend` (a body of Content-Length bytes)."""

    async def send(self, message: Any) -> None:  # Any: the extension is not in uvicorn's typed events
        if message.get("type") != ZEROCOPY:
            await super().send(message)
            return
        if not self.response_started or self.response_complete or self.chunked_encoding:
            raise RuntimeError(f"{ZEROCOPY} needs a started response with a Content-Length")
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        offset, count = int(message.get("offset") or 0), message.get("count")
        file = message["file"]
        if count is None:
            count = os.fstat(file.fileno()).st_size - offset
        if count > self.expected_content_length:
            raise RuntimeError("Response content longer than Content-Length")
        if self.scope["method"] != "HEAD" and count:
            try:
                sent = await self._sendfile(file, offset, count)
            except (ConnectionError, RuntimeError):  # the client hung up (or the transport closed)
                self.transport.close()
                return
            if sent != count:  # the file shrank: the peer must not take a short body for a whole one
                self.transport.close()
                raise RuntimeError(f"sendfile sent {sent} of {count} bytes")
        self.expected_content_length -= count
        if not message.get("more_body", False):
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()


    async def _sendfile(self, file: BinaryIO, offset: int, count: int) -> int:
        """`count` bytes of `file` from `offset` down the transport: by sendfile(2) on asyncio's loop;
        uvloop has no loop.sendfile (NotImplementedError), there 1 MiB reads are written instead."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.sendfile(self.transport, file, offset, count)
        except NotImplementedError:
            pass
        sent = 0
        while sent < count:
            chunk = await asyncio.to_thread(os.pread, file.fileno(), min(CHUNK, count - sent), offset + sent)
            if not chunk:
                break
            self.transport.write(chunk)
            sent += len(chunk)
            if self.flow.write_paused and not self.disconnected:
                await self.flow.drain()
            if self.disconnected:
                raise ConnectionResetError("the client hung up")
        return sent


class SendfileProtocol(HeaderTimeoutProtocol):
    """The services' httptools protocol (header deadline) whose requests can be answered by sendfile."""

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {ZEROCOPY: {}}

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self.cycle is not None and type(self.cycle) is RequestResponseCycle:
            self.cycle.__class__ = SendfileCycle  # before its task first runs: only send() differs


def server_options() -> dict[str, Any]:
    """uvicorn options of an origin or relay: every service's, with the sendfile protocol on asyncio's
    own loop (uvloop, uvicorn's default when installed, cannot sendfile)."""
    return {**base_server_options(), "http": SendfileProtocol, "loop": "asyncio"}
