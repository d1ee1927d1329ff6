"""The heartbeat fast path (its one route, called ahead of the middleware stack + one Redis script) and
`serve --workers N` replicas.

Real anvil, real Redis, real uvicorn (in a thread, and as `intellect-orchestrator serve --workers 2`
processes stopped by pid).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import redis

from intellect.identity import Wallet
from intellect.net import free_port
from intellect.redis_server import EmbeddedRedis
from intellect.signing import SignedAuth, sign_request
from intellect.wire.heartbeat import HeartbeatRequest
from orchestrator.app import create_app
from orchestrator.chain import LedgerPoolChain
from orchestrator.db import make_engine, migrate, session_factory
from orchestrator.models import NodeRow, utcnow
from orchestrator.settings import OrchestratorSettings
from tests.support.testing import serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
BODY = HeartbeatRequest(metrics={"tok_s": 1.0}).model_dump_json().encode()


def seed(state_dir: Path, states: dict[str, str], database_url: str | None = None) -> None:
    engine = make_engine(database_url or f"sqlite:///{state_dir / 'orchestrator.db'}")
    migrate(engine)
    with session_factory(engine)() as session, session.begin():
        session.add_all(NodeRow(address=a, state=s, misses=0, in_pool=False, invite_attempts=0,
                                state_changed_at=utcnow(), created_at=utcnow()) for a, s in states.items())
    engine.dispose()


def beat(url: str, node: Wallet, body: bytes = BODY, headers: dict[str, str] | None = None) -> httpx.Response:
    headers = headers or sign_request(node, "POST", "/heartbeat", body)
    return httpx.post(url + "/heartbeat", content=body, timeout=30,
                      headers={**headers, "Content-Type": "application/json"})


@pytest.fixture
def orchestrator(devnet, redis_url, tmp_path):
    """An in-thread orchestrator with a Healthy, a Banned and an Ejected node; loops off."""
    healthy, banned, ejected = Wallet.create(), Wallet.create(), Wallet.create()
    seed(tmp_path, {healthy.address: "Healthy", banned.address: "Banned", ejected.address: "Ejected"})
    settings = OrchestratorSettings(pool_id=devnet.pool_id, redis_url=redis_url, state_dir=tmp_path,
                                    rpc_url=devnet.rpc_url, run_background_loops=False,
                                    heartbeat_rate_limit_per_minute=5)
    chain = LedgerPoolChain(devnet.client(devnet.manager), devnet.pool_id, devnet.manager)
    server = serve_in_thread(create_app(settings, manager=devnet.manager, chain=chain))
    token = settings.admin_token_file.read_text().strip()
    yield server.url, token, (healthy, banned, ejected), redis.Redis.from_url(redis_url), devnet.pool_id
    server.stop()


def test_fast_route_answers_and_refuses_like_the_documented_one(orchestrator) -> None:
    url, token, (healthy, banned, ejected), r, pool = orchestrator
    seen = f"orch:{{{pool}}}:seen"
    reply = beat(url, healthy)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "application/json"
    default_interval = OrchestratorSettings.model_fields["heartbeat_interval_seconds"].default
    assert reply.json() == {"current_task": None, "interval_seconds": default_interval}
    assert r.zscore(seen, healthy.address) is not None
    # a replay is refused and writes nothing
    headers = sign_request(healthy, "POST", "/heartbeat", BODY)
    assert beat(url, healthy, headers=headers).status_code == 200
    before = r.zscore(seen, healthy.address)
    time.sleep(0.01)
    replay = beat(url, healthy, headers=headers)
    assert replay.status_code == 401 and "replayed" in replay.json()["detail"]
    assert r.zscore(seen, healthy.address) == before
    # banned and ejected nodes: 403 with the reason, and no liveness recorded
    for node, word in ((banned, "banned"), (ejected, "ejected")):
        refused = beat(url, node)
        assert refused.status_code == 403 and word in refused.json()["detail"]
        assert r.zscore(seen, node.address) is None
    # an unknown signer: 404; a body naming a node: 422 in FastAPI's error shape
    stranger = beat(url, Wallet.create())
    assert stranger.status_code == 404 and "wait for an invite" in stranger.json()["detail"]
    forged = b'{"node_address": "' + banned.address.encode() + b'"}'
    bad = httpx.post(url + "/heartbeat", content=forged, auth=SignedAuth(healthy), timeout=30)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == "node_address"
    # over the body limit: 413 before any signature work
    huge = json.dumps({"metrics": {f"metric_{i}": 1.0 for i in range(8000)}}).encode()
    too_big = beat(url, healthy, body=huge)
    assert too_big.status_code == 413 and "over" in too_big.json()["detail"]
    # the per-minute rate limit (5 here) is counted in Redis: the next heartbeats are 429
    codes = [beat(url, healthy).status_code for _ in range(4)]
    assert codes[-1] == 429 and 200 not in codes[codes.index(429):]
    # the route is still documented with its request schema
    spec = httpx.get(url + "/openapi.json").json()
    post = spec["paths"]["/heartbeat"]["post"]
    assert "X-Intellect" in post["description"] or "Signed" in post["description"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["title"] == "HeartbeatRequest"
    metrics = httpx.get(url + "/metrics").text
    assert 'orchestrator_heartbeats_total{result="ok"}' in metrics
    assert 'orchestrator_heartbeats_total{result="403"} 2.0' in metrics


def test_task_reply_follows_the_version_counter(orchestrator) -> None:
    url, token, (healthy, _, _), _, _ = orchestrator
    admin = {"Authorization": f"Bearer {token}"}
    made = httpx.post(url + "/tasks", json={"name": "t", "image": "i"}, headers=admin, timeout=30).json()
    assert beat(url, healthy).json()["current_task"]["task"]["id"] == made["id"]
    httpx.delete(f"{url}/tasks/{made['id']}", headers=admin, timeout=30)
    assert beat(url, healthy).json()["current_task"] is None


def test_serve_with_two_workers_shares_state_and_runs_loops_once(devnet, database_url, tmp_path) -> None:
    """Replicas behind one Redis and one SQL database (SQLite file, or PostgreSQL for scale-out)."""
    with EmbeddedRedis() as redis:  # its own Redis: no leader lease or counters left by another variant
        two_workers(devnet, redis.url, database_url, tmp_path)


def two_workers(devnet, redis_url: str, database_url: str, tmp_path: Path) -> None:
    nodes = [Wallet.create() for _ in range(4)]
    seed(tmp_path, {n.address: "Healthy" for n in nodes}, database_url)
    port = free_port()
    env = {**os.environ, "INTELLECT_ORCH_MANAGER_KEY": devnet.manager.private_key_hex()}
    for key, value in {"port": port, "pool_id": devnet.pool_id, "redis_url": redis_url, "state_dir": tmp_path,
                       "database_url": database_url,
                       "rpc_url": devnet.rpc_url, "deployment": tmp_path / "deployment.json",
                       "discovery_url": "http://127.0.0.1:9", "heartbeat_interval_seconds": 0.5,
                       "heartbeat_ttl_seconds": 1.5, "check_interval_seconds": 0.5, "miss_threshold": 2,
                       "eject_dead_nodes": "false", "invite_interval_seconds": 60}.items():
        env[f"INTELLECT_ORCH_{key.upper()}"] = str(value)
    devnet.deployment.save(tmp_path / "deployment.json")
    scratch = tmp_path / "tmp"  # serve's PROMETHEUS_MULTIPROC_DIR goes here (TMPDIR) and is removed on exit
    scratch.mkdir()
    env["TMPDIR"] = str(scratch)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "serve", "--workers", "2",
                             "--log-level", "warning"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "serve --workers 2 did not start"
            time.sleep(0.2)
        time.sleep(2)  # both API processes up
        kids = [p for p in psutil.Process(proc.pid).children()
                if "resource_tracker" not in " ".join(p.cmdline())]
        assert len(kids) == 3  # two API processes and one for the background loops
        token = (tmp_path / "admin-token").read_text().strip()
        admin = {"Authorization": f"Bearer {token}"}
        # one admin token for every process (made once by the parent, not raced)
        assert all(httpx.get(url + "/tasks", headers=admin, timeout=10).status_code == 200 for _ in range(12))
        # a task made through one process reaches heartbeats served by any of them (version counter)
        made = httpx.post(url + "/tasks", json={"name": "t", "image": "i"}, headers=admin, timeout=10).json()
        for _ in range(3):
            for node in nodes[:3]:
                reply = beat(url, node)
                assert reply.status_code == 200, reply.text
                assert reply.json()["current_task"]["task"]["id"] == made["id"]
        # multiprocess metrics: whichever process answers /metrics counts the heartbeats of both
        assert [p.name for p in scratch.iterdir()][0].startswith("intellect-prometheus-")
        for _ in range(8):
            exposition = httpx.get(url + "/metrics", timeout=10).text
            assert 'orchestrator_heartbeats_total{result="ok"} 9.0' in exposition
        httpx.delete(f"{url}/tasks/{made['id']}", headers=admin, timeout=10)
        assert all(beat(url, n).json()["current_task"] is None for n in nodes[:3])
        # the liveness loop runs (in its own process): the silent node goes Dead, the others stay up
        silent = nodes[3].address
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/nodes/{silent}", headers=admin, timeout=10).json()["state"] != "Dead":
            for node in nodes[:3]:
                beat(url, node)
            assert time.monotonic() < deadline, "the silent node never went Dead"
            time.sleep(0.3)
        first = httpx.get(f"{url}/nodes/{nodes[0].address}", headers=admin, timeout=10).json()
        assert first["state"] == "Healthy"
    finally:
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.terminate()
        proc.wait(timeout=30)
        gone, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, f"processes left behind: {[p.pid for p in alive]}"
    assert list(scratch.iterdir()) == []
