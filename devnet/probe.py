"""`python3 -m devnet.probe URL`: exit 0 when the service at URL answers; for compose health checks.

Standard library only, so a check costs a few milliseconds of start-up even in a busy container:
`http(s)://…` must answer 2xx to GET; `redis://host:port` must answer PING; `rpc+http://…` must
answer a JSON-RPC `eth_chainId`.
"""

from __future__ import annotations

import json
import socket
import sys
import urllib.parse
import urllib.request


def probe(url: str, timeout: float = 2.0) -> None:
    if url.startswith("redis://"):
        parts = urllib.parse.urlsplit(url)
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), timeout) as s:
            s.sendall(b"PING\r\n")
            if not s.recv(16).startswith(b"+PONG"):
                raise RuntimeError("redis did not answer PONG")
        return
    if url.startswith("rpc+"):
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}).encode()
        request = urllib.request.Request(url[4:], body, {"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            if "result" not in json.load(response):
                raise RuntimeError("no chain id in the answer")
        return
    with urllib.request.urlopen(url, timeout=timeout):
        pass  # urlopen raises on 4xx/5xx


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 -m devnet.probe URL", file=sys.stderr)
        return 2
    try:
        probe(argv[0])
    except Exception as exc:
        print(f"{argv[0]}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
