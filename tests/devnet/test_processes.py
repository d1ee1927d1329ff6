"""Devnet process control (issue 19.8): stopping a process takes what it forked along, so a restart
finds its port free; before, a drill's restart of Redis could die on "Address already in use"."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import psutil

from devnet.processes import restart, spawn
from devnet.state import DevnetState
from intellect.net import free_port

# Listens on PORT, then forks a child that keeps the listening socket (as a redis-server's AOF
# rewrite does) and sleeps.
SERVER = """
import http.server, os, sys, time

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")

server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health)
if os.fork() == 0:
    time.sleep(600)
server.serve_forever()
"""

def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_kill_takes_the_forked_children_and_restart_reuses_the_port(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-c", SERVER, str(port)]
    proc = spawn("server", argv, {}, tmp_path, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 10
    children = []  # the server listens before it forks: wait for both (a busy machine shows the gap)
    while not (listening(port) and children) and time.monotonic() < deadline:
        time.sleep(0.05)
        children = psutil.Process(proc.pid).children()
    assert listening(port) and len(children) == 1
    state = DevnetState(directory=str(tmp_path), rpc_url="http://127.0.0.1:9", chain_id=1,
                        deployment_path="", domain_id=0, pool_id=0, accounts=[], processes=[proc])
    new = restart(state, "server", kill=True, timeout=20)
    try:
        assert not children[0].is_running() or children[0].status() == psutil.STATUS_ZOMBIE
        assert new.alive() and new.pid != proc.pid
        deadline = time.monotonic() + 10
        while not listening(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert listening(port)
    finally:
        new.kill()
