"""Hostile input against the real orchestrator and discovery (uvicorn on loopback, real anvil and
Redis): huge unsigned bodies are refused while they stream, before auth or parsing; values JSON cannot
carry get a 422 with a JSON reason, never a 500; what a worker could never run is refused at
`POST /tasks`; the SYNTHETIC-2 task body is accepted; a dead Redis is a 503 with a JSON reason."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "uploads"))

from uploads_world import Orchestrator  # noqa: E402

from discovery.app import create_app as create_discovery  # noqa: E402
from discovery.chain import LedgerChainView  # noqa: E402
from discovery.settings import DiscoverySettings  # noqa: E402
from intellect.identity import Wallet  # noqa: E402
from intellect.redis_server import EmbeddedRedis  # noqa: E402
from intellect.signing import SignedAuth  # noqa: E402
from tests.support.testing import serve_in_thread  # noqa: E402

SEED_BODY = Path(__file__).parents[1] / "fixtures" / "synthetic2_task.json"


def chunks(total: int, size: int = 64 * 1024):  # noqa: ANN201
    for _ in range(total // size):
        yield b"x" * size


@pytest.fixture(scope="module")
def redis():  # noqa: ANN201
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture(scope="module")
def orch(devnet, redis, tmp_path_factory):  # noqa: ANN001, ANN201
    o = Orchestrator(devnet, redis.url, tmp_path_factory.mktemp("orch")).start()
    yield o
    o.stop()


@pytest.fixture(scope="module")
def discovery(devnet, redis, tmp_path_factory):  # noqa: ANN001, ANN201
    settings = DiscoverySettings(
        redis_url=redis.url, state_dir=tmp_path_factory.mktemp("disc"), pool_id=devnet.pool_id
    )
    server = serve_in_thread(create_discovery(settings, LedgerChainView(devnet.client())))
    yield server.url
    server.stop()


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 1e6


@pytest.mark.parametrize("target", ["discovery", "orchestrator"])
def test_huge_unsigned_chunked_bodies_are_cut_off_early(target, orch, discovery) -> None:  # noqa: ANN001
    url = {"discovery": f"{discovery}/nodes", "orchestrator": f"{orch.url}/tasks"}[target]
    method = "PUT" if target == "discovery" else "POST"
    before = rss_mb()
    try:
        r = httpx.request(method, url, content=chunks(200 * 1024 * 1024), timeout=60)
        assert r.status_code == 413 and "larger than" in r.json()["detail"]
    except httpx.TransportError:
        pass  # the server closed the connection on the client mid-upload: also refused early
    assert rss_mb() - before < 100, "the server buffered the body"


@pytest.mark.parametrize("target", ["discovery", "orchestrator", "heartbeat"])
def test_a_deeply_nested_unsigned_body_does_not_kill_the_service(target, orch, discovery) -> None:  # noqa: ANN001
    """Nested 100,000 levels (200 KB; 32 KB for the heartbeat, under its own size limit), no token, no
    signature: it used to segfault both services. The heartbeat is served before the app's guard and
    bounds its body itself."""
    base = {"discovery": discovery, "orchestrator": orch.url, "heartbeat": orch.url}[target]
    url = {"discovery": f"{discovery}/nodes", "orchestrator": f"{orch.url}/tasks",
           "heartbeat": f"{orch.url}/heartbeat"}[target]
    levels = 16_000 if target == "heartbeat" else 100_000
    deep = b"[" * levels + b"]" * levels
    r = httpx.request("PUT" if target == "discovery" else "POST", url, content=deep,
                      headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
    assert r.status_code == 400 and "nested deeper" in r.json()["detail"], r.text
    assert httpx.get(f"{base}/health", timeout=10).status_code == 200  # still alive


@pytest.mark.parametrize("raw", [b'{"name": 1e400, "image": "i"}', b'{"name": "\\ud800", "image": "i"}'])
def test_unencodable_values_are_422_json(orch, raw: bytes) -> None:  # noqa: ANN001
    headers = {"content-type": "application/json", "Authorization": f"Bearer {orch.token}"}
    r = httpx.post(orch.url + "/tasks", content=raw, headers=headers, timeout=30)
    assert r.status_code == 422, r.text
    assert isinstance(r.json()["detail"], list)


def test_signed_garbage_from_an_unregistered_key_is_4xx(orch, discovery) -> None:  # noqa: ANN001
    stranger = Wallet.create()
    for url, method in ((f"{discovery}/nodes", "PUT"), (f"{orch.url}/heartbeat", "POST")):
        for raw in (b'{"metrics": {"a": 1e400}}', b'{"node_address": "\\ud800"}', b"[1, 2"):
            r = httpx.request(method, url, content=raw, auth=SignedAuth(stranger),
                              headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
            assert 400 <= r.status_code < 500, (url, raw, r.status_code, r.text)
            assert r.headers["content-type"].startswith("application/json")


@pytest.mark.parametrize(
    ("patch", "words"),
    [
        ({"env_vars": {"A=B": "x"}}, "env var name"),
        ({"cmd": ["a\x00b"]}, "NUL"),
        ({"volume_mounts": [{"host_path": "x", "container_path": "/data"}]}, "reserved"),
        ({"volume_mounts": [{"host_path": "x", "container_path": "/run/intellect"}]}, "reserved"),
        ({"volume_mounts": [{"host_path": "x", "container_path": "/"}]}, "container_path"),
        ({"volume_mounts": [{"host_path": "../x", "container_path": "/y"}]}, "'..'"),
        ({"storage_config": {"file_name_template": "../../x"}}, "'..'"),
        ({"storage_config": {"file_name_template": "/etc/passwd"}}, "relative"),
        ({"cmd": ["x" * 40_000]}, "longer than"),
        ({"env_vars": {f"K{i}": "v" for i in range(50_000)}}, "at most"),
    ],
)
def test_tasks_a_worker_could_never_run_are_refused(orch, patch: dict, words: str) -> None:  # noqa: ANN001
    r = orch.admin("POST", "/tasks", json={"name": "t", "image": "i"} | patch)
    assert r.status_code in (413, 422), r.text
    assert words in r.text or r.status_code == 413


def test_seed_task_body_is_accepted_as_written(orch) -> None:  # noqa: ANN001
    body = json.loads(SEED_BODY.read_text())
    r = orch.admin("POST", "/tasks", json=body)
    assert r.status_code == 201, r.text
    stored = r.json()["spec"]
    assert stored["volume_mounts"][0]["host_path"] == "group-${GROUP_ID}-state"
    assert stored["scheduling_config"] == body["scheduling_config"]


def test_redis_down_is_503_json_and_recovers(devnet, tmp_path) -> None:  # noqa: ANN001
    with EmbeddedRedis() as own:
        o = Orchestrator(devnet, own.url, tmp_path / "orch").start()
        try:
            assert o.admin("GET", "/tasks").status_code == 200
            own.stop()
            r = o.admin("GET", "/tasks")
            # the task list is in SQL: it may still answer; anything touching Redis must be a JSON 503
            r = httpx.post(o.url + "/heartbeat", content=b"{}", auth=SignedAuth(Wallet.create()), timeout=30)
            assert r.status_code == 503, r.text
            assert r.json()["detail"].startswith("redis unavailable")
        finally:
            o.stop()
