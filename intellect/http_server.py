"""How every service's uvicorn speaks HTTP: httptools, plus a deadline for a request's head.

uvicorn closes a keep-alive connection that idles after a response, but a connection that never
sends a request, or sends its headers a byte at a time, is held open forever: enough of them (one
small process each) exhaust the server's descriptors. `HeaderTimeoutProtocol` closes a connection
whose request line and headers are not complete `HEADER_TIMEOUT` seconds after it opened (or after
its previous response). Bodies and long-polls are not affected: the deadline ends at the headers.
Every entry point passes `**server_options()` to `uvicorn.run` / `uvicorn.Config`.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_TIMEOUT = 15.0


class HeaderTimeoutProtocol(HttpToolsProtocol):
    header_timeout = HEADER_TIMEOUT
    _header_deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_deadline is None:  # the next request on a kept-alive connection
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()


def server_options() -> dict[str, Any]:
    """What every service gives uvicorn, beside its host and port."""
    return {"http": HeaderTimeoutProtocol}


def bind_listener(host: str, port: int) -> socket.socket:
    """A service's listening socket, bound before anything else starts (port 0: a free one), so a port
    already taken stops the service at start with one line instead of a process that runs on without
    its API; uvicorn then serves on it (`uvicorn.Server(...).run(sockets=[listener])`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


def exit_if_port_taken(host: str, port: int, what: str, flag: str = "--port") -> None:
    """For a service that lets uvicorn bind (or spawns workers that do): try the bind first, before
    anything starts, and stop with one line and exit 1 when the port is taken, instead of a uvicorn
    traceback after the service's start-up (or a service running on without its API)."""
    if port == 0:
        return
    try:
        bind_listener(host, port).close()
    except OSError as exc:
        print(f"error: cannot serve the {what} on {host}:{port}: {exc.strerror or exc} (another one "
              f"running? pick another {flag})", file=sys.stderr)  # fmt: skip
        raise SystemExit(1) from None
