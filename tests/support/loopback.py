"""Small servers on loopback for the tests and benches: a folder over HTTP, a TCP echo, and the accept
loop of a test's own socket server. Each runs on daemon threads and stops when its socket is closed."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@contextmanager
def served_folder(root: Path) -> Iterator[str]:
    """A new folder `root` served over HTTP on a free loopback port, without request logs (as a trainer
    serves its step counter and checkpoints): its base URL, while in the block."""
    root.mkdir()

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, directory=str(root), **kw)

        def log_message(self, *a: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def accept_each(server: socket.socket, handle: Callable[[socket.socket], None]) -> None:
    """Hand every connection `server` accepts to `handle`, one after the other, until it is closed."""
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        handle(conn)


def echo_server() -> tuple[socket.socket, int]:
    """A TCP server on a free loopback port that sends every byte back as it comes (a thread per
    connection, Nagle off), and its port; closing the socket stops it."""
    server = socket.create_server(("127.0.0.1", 0))

    def echo(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def start_echo(conn: socket.socket) -> None:
        threading.Thread(target=echo, args=(conn,), daemon=True).start()

    threading.Thread(target=accept_each, args=(server, start_echo), daemon=True).start()
    return server, server.getsockname()[1]
