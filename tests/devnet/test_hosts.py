"""The multi-host world (devnet/hosts.py): real namespaces, veths, a bridge and nftables, real HTTP
servers in them. Needs root and nftables (CI has both: .ci/run installs nftables)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from devnet.hosts import Host, HostsError, World, namespaces

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
# answers GET with the address the connection came from
ECHO = """
import http.server as h, sys
class H(h.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(self.client_address[0].encode())
    def log_message(self, *a): pass
h.HTTPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
"""


@pytest.fixture
def world():  # noqa: ANN201
    w = World.create()
    try:
        yield w
    finally:
        w.destroy()
    assert w.own_namespaces() == []


def serve(host: Host, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(host.argv([sys.executable, "-c", ECHO, str(port)]))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if fetch(host, f"http://127.0.0.1:{port}/", timeout=0.5)[0] == 0:
            return proc
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the echo server in {host.name} did not start")


def fetch(host: Host, url: str, timeout: float = 2.0) -> tuple[int, str]:
    """GET `url` from inside `host`: (0, body) or (1, the error's last line)."""
    code = f"import httpx; print(httpx.get({url!r}, timeout={timeout}).text)"
    done = subprocess.run(host.argv([sys.executable, "-c", code]), capture_output=True, text=True)
    if done.returncode == 0:
        return 0, done.stdout.strip()
    return 1, (done.stderr.strip().splitlines() or [""])[-1]


def test_hosts_have_their_own_addresses_and_nat_lets_nothing_in(world: World) -> None:
    orch, val = world.add_host("orch"), world.add_host("val")
    router = world.add_home("home")
    nated = world.add_host("gamer", behind="home")
    assert len({orch.address, val.address, nated.address, router}) == 4
    serve(orch, 8080)
    serve(nated, 8081)
    # public to public: the server sees the client's own address
    assert fetch(val, f"http://{orch.address}:8080/") == (0, val.address)
    # out of the home: the server sees the router's address (masquerade), not the private one
    assert fetch(nated, f"http://{orch.address}:8080/") == (0, router) and nated.public_address == router
    # into the home: no path at all, neither to the private address nor through the router
    assert fetch(orch, f"http://{nated.address}:8081/")[0] == 1
    assert fetch(orch, f"http://{router}:8081/")[0] == 1
    # loopback is each host's own: the orchestrator's port is not on the validator's 127.0.0.1
    assert fetch(val, "http://127.0.0.1:8080/")[0] == 1
    # the devnet command reaches public hosts through its leg on the world's internet
    assert httpx.get(f"http://{orch.address}:8080/", timeout=2).text == world.gateway


def test_a_partition_cuts_both_ways_and_heal_restores(world: World) -> None:
    orch, val = world.add_host("orch"), world.add_host("val")
    world.add_home("home")
    nated = world.add_host("gamer", behind="home")
    serve(orch, 8080)
    serve(val, 8080)
    world.partition("val", "orch")
    assert fetch(val, f"http://{orch.address}:8080/", timeout=1)[0] == 1
    assert fetch(orch, f"http://{val.address}:8080/", timeout=1)[0] == 1
    assert fetch(nated, f"http://{orch.address}:8080/") == (0, nated.public_address)  # others unaffected
    world.partition("gamer", "orch")  # a NATed host: cut on its side (others see only its router)
    assert fetch(nated, f"http://{orch.address}:8080/", timeout=1)[0] == 1
    assert fetch(nated, f"http://{val.address}:8080/") == (0, nated.public_address)
    world.heal("val", "orch")
    world.heal("gamer", "orch")
    assert fetch(val, f"http://{orch.address}:8080/") == (0, val.address)
    assert fetch(nated, f"http://{orch.address}:8080/") == (0, nated.public_address)
    with pytest.raises(HostsError, match="no host 'nobody'"):
        world.partition("val", "nobody")


def test_bad_names_are_refused_with_the_rule(world: World) -> None:
    for bad in ("Orch", "a-b", "x" * 11, "core"):
        with pytest.raises(HostsError):
            world.add_host(bad)
    with pytest.raises(HostsError, match="no home router 'nowhere'"):
        world.add_host("w", behind="nowhere")


MAKER = """
import json, subprocess, sys, time
from devnet.hosts import World
w = World.create()
a = w.add_host("a")
w.add_home("h")
b = w.add_host("b", behind="h")
procs = [subprocess.Popen(h.argv(["sleep", "600"])) for h in (a, b)]
print(json.dumps({"index": w.index, "pids": [p.pid for p in procs]}), flush=True)
time.sleep(600)
"""


def test_a_world_whose_maker_was_killed_is_removed_whole_by_its_number() -> None:
    maker = subprocess.Popen([sys.executable, "-c", MAKER], stdout=subprocess.PIPE, text=True,
                             cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
    assert maker.stdout is not None
    made = json.loads(maker.stdout.readline())
    index, pids = made["index"], made["pids"]
    maker.send_signal(signal.SIGKILL)
    maker.wait()
    mine = [n for n in namespaces() if n.startswith(f"ix{index}-")]
    assert sorted(mine) == sorted(f"ix{index}-{n}" for n in ("core", "a", "h", "b"))
    assert all(_alive(p) for p in pids)  # orphans the killed maker left running in the world
    removed = World.attach(index).destroy()
    assert sorted(removed) == sorted(mine)
    assert not [n for n in namespaces() if n.startswith(f"ix{index}-")]
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"ix{index}r" not in links.split(), "the devnet command's leg outlived its world"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False
