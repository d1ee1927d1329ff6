"""Shared by tests/uploads and tests/groups: a real orchestrator (uvicorn thread) on a real devnet and Redis,
nodes that joined the pool on chain, signed heartbeats and upload requests.

Nodes need no discovery record: the orchestrator's invite loop finds them in the pool on chain and
answers their heartbeats (the path an orchestrator restart with a fresh database takes).
"""

# ruff: noqa: E402
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the real `orchestrator`/`worker` packages

import httpx

from intellect.identity import Wallet
from intellect.net import free_port
from intellect.signing import SignedAuth
from intellect.wire.heartbeat import HeartbeatRequest
from intellect.wire.storage import UploadRequest
from orchestrator.app import create_app
from orchestrator.chain import LedgerPoolChain
from orchestrator.settings import OrchestratorSettings
from tests.support.testing import Devnet, ServerThread, serve_in_thread, wait_for

FAST: dict[str, Any] = dict(
    heartbeat_interval_seconds=0.3, heartbeat_ttl_seconds=300, check_interval_seconds=0.5, miss_threshold=2,
    invite_interval_seconds=0.3, invite_timeout_seconds=30, http_timeout_seconds=1, http_retries=1,
    groups_interval_seconds=0.3,
)


class Orchestrator:
    """The orchestrator app in a uvicorn thread; `restart()` keeps its state dir and Redis."""

    def __init__(self, devnet: Devnet, redis_url: str, state_dir: Path, **overrides: Any) -> None:
        self.devnet = devnet
        self.port = free_port()
        self.settings = OrchestratorSettings(
            pool_id=devnet.pool_id, redis_url=redis_url, state_dir=state_dir,
            discovery_url=f"http://127.0.0.1:{free_port()}",  # nothing there: nodes come from the chain
            rpc_url=devnet.rpc_url, public_url=f"http://127.0.0.1:{self.port}", **{**FAST, **overrides})
        self.server: ServerThread | None = None
        self.token = ""

    def start(self) -> Orchestrator:
        net = self.devnet
        chain = LedgerPoolChain(net.client(net.manager), net.pool_id, net.manager)
        self.server = serve_in_thread(create_app(self.settings, manager=net.manager, chain=chain), self.port)
        self.token = self.settings.admin_token_file.read_text().strip()
        return self

    def stop(self) -> None:
        if self.server:
            self.server.stop()
            self.server = None

    def restart(self) -> Orchestrator:
        self.stop()
        return self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, self.url + path, headers={"Authorization": f"Bearer {self.token}"},
                             timeout=30, **kwargs)

    def create_task(self, spec: dict[str, Any]) -> str:
        response = self.admin("POST", "/tasks", json=spec)
        assert response.status_code == 201, response.text
        return response.json()["id"]

    def heartbeat(self, node: Wallet, beat: HeartbeatRequest | None = None) -> httpx.Response:
        return httpx.post(self.url + "/heartbeat", content=(beat or HeartbeatRequest()).model_dump_json(),
                          auth=SignedAuth(node), headers={"Content-Type": "application/json"}, timeout=30)

    def assigned(self, node: Wallet) -> dict[str, Any] | None:
        response = self.heartbeat(node)
        assert response.status_code == 200, response.text
        return response.json()["current_task"]

    def request_upload(self, node: Wallet, request: UploadRequest | dict[str, Any]) -> httpx.Response:
        body = request.model_dump_json() if isinstance(request, UploadRequest) else json.dumps(request)
        return httpx.post(self.url + "/storage/request-upload", content=body, auth=SignedAuth(node),
                          headers={"Content-Type": "application/json"}, timeout=30)

    def state_of(self, node: Wallet) -> str | None:
        response = self.admin("GET", f"/nodes/{node.address}")
        return response.json()["state"] if response.status_code == 200 else None


def joined_nodes(devnet: Devnet, count: int, provider: Wallet | None = None) -> list[Wallet]:
    """`count` fresh nodes registered under one provider and joined to the pool on chain."""
    provider = provider or devnet.new_provider()
    nodes = []
    for _ in range(count):
        node = devnet.new_node(provider)
        devnet.join(provider, node)
        nodes.append(node)
    return nodes


def make_healthy(orch: Orchestrator, nodes: list[Wallet], timeout: float = 20) -> None:
    """Heartbeat until the orchestrator (which learns of them from the chain) calls each node Healthy."""

    def all_healthy() -> bool:
        for node in nodes:
            if orch.heartbeat(node).status_code != 200:
                return False
        return all(orch.state_of(n) == "Healthy" for n in nodes)

    wait_for(all_healthy, timeout, "nodes Healthy")


class Heartbeats:
    """Background heartbeats for a set of nodes; `silence(node)` stops one (as if it died)."""

    def __init__(self, orch: Orchestrator, nodes: list[Wallet], every: float = 0.3) -> None:
        self.orch = orch
        self.nodes = list(nodes)
        self.every = every
        self.replies: dict[str, Any] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                nodes = list(self.nodes)
            for node in nodes:
                try:
                    response = self.orch.heartbeat(node)
                    self.replies[node.address] = (response.status_code, response.json())
                except (httpx.HTTPError, ValueError):
                    pass
            self._stop.wait(self.every)

    def start(self) -> Heartbeats:
        self._thread.start()
        return self

    def add(self, node: Wallet) -> None:
        with self._lock:
            self.nodes.append(node)

    def silence(self, node: Wallet) -> None:
        with self._lock:
            self.nodes = [n for n in self.nodes if n.address != node.address]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
