"""Orchestrators in threads, the discovery upload of a node, and polling: shared by the lifecycle and
replica tests (real anvil, Redis, discovery and uvicorn; see conftest.py for the servers)."""

from __future__ import annotations

import httpx

from intellect.identity import Wallet
from intellect.signing import SignedAuth
from intellect.wire.heartbeat import HeartbeatRequest
from intellect.wire.nodes import ComputeSpecs, NodeMetadata
from orchestrator.app import create_app
from orchestrator.settings import OrchestratorSettings
from tests.support.testing import serve_in_thread

FAST = dict(heartbeat_interval_seconds=0.5, heartbeat_ttl_seconds=1.5, check_interval_seconds=0.5,
            miss_threshold=2, invite_interval_seconds=0.5, invite_timeout_seconds=4, http_timeout_seconds=5,
            http_retries=2, eject_after_seconds=6)


class Orchestrator:
    def __init__(self, devnet, redis_url: str, discovery_url: str, state_dir, **overrides: object) -> None:
        self.settings = OrchestratorSettings(
            pool_id=devnet.pool_id, redis_url=redis_url, state_dir=state_dir, discovery_url=discovery_url,
            rpc_url=devnet.rpc_url, **{**FAST, **overrides})
        self.devnet = devnet
        self.server = None

    def start(self) -> Orchestrator:
        from intellect.net import free_port
        from orchestrator.chain import LedgerPoolChain

        port = free_port()
        self.settings.public_url = f"http://127.0.0.1:{port}"
        net = self.devnet
        chain = LedgerPoolChain(net.client(net.manager), net.pool_id, net.manager)
        self.server = serve_in_thread(create_app(self.settings, manager=net.manager, chain=chain), port)
        self.token = self.settings.admin_token_file.read_text().strip()
        return self

    def stop(self) -> None:
        self.server.stop()

    @property
    def url(self) -> str:
        return self.server.url

    def admin(self, method: str, path: str, **kwargs) -> httpx.Response:
        return httpx.request(method, self.url + path, headers={"Authorization": f"Bearer {self.token}"},
                             timeout=30, **kwargs)

    def node(self, address: str) -> dict:
        return self.admin("GET", f"/nodes/{address}").json()

    def heartbeat(self, node: Wallet, beat: HeartbeatRequest | None = None) -> httpx.Response:
        body = (beat or HeartbeatRequest()).model_dump_json()
        return httpx.post(self.url + "/heartbeat", content=body, auth=SignedAuth(node),
                          headers={"Content-Type": "application/json"}, timeout=30)


def upload(discovery_url: str, node: Wallet, provider: Wallet, worker_url: str) -> None:
    host, port = worker_url.removeprefix("http://").split(":")
    meta = NodeMetadata(node_address=node.address, provider_address=provider.address, ip_address=host,
                        port=int(port),
                        compute_specs=ComputeSpecs(cpu_cores=2, ram_mb=2048, disk_free_mb=1000))
    r = httpx.put(f"{discovery_url}/nodes", content=meta.model_dump_json(), auth=SignedAuth(node),
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
