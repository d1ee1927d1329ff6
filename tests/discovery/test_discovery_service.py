"""Discovery against a real anvil, a real Redis and a real uvicorn server."""

from __future__ import annotations

import time

import httpx
import pytest

from discovery.app import create_app
from discovery.chain import LedgerChainView
from discovery.settings import DiscoverySettings
from intellect.identity import Wallet
from intellect.signing import SignedAuth, sign_request
from intellect.wire.nodes import ComputeSpecs, NodeMetadata
from tests.support.testing import serve_in_thread


def metadata(node: Wallet, provider: Wallet, ip: str | None = None, port: int = 9000,
             cores: int = 4) -> NodeMetadata:
    # one IP per node unless a test says otherwise: the service is set to 2 nodes per IP
    ip = ip or f"10.1.{int(node.address[2:4], 16)}.{int(node.address[4:6], 16)}"
    return NodeMetadata(node_address=node.address, provider_address=provider.address, ip_address=ip,
                        port=port,
                        compute_specs=ComputeSpecs(cpu_cores=cores, ram_mb=4096, disk_free_mb=10_000))


@pytest.fixture(scope="module")
def service(devnet, redis_url, tmp_path_factory):
    settings = DiscoverySettings(redis_url=redis_url, state_dir=tmp_path_factory.mktemp("disc"),
                                 pool_id=devnet.pool_id, max_nodes_per_ip=2, sync_interval_seconds=0.5,
                                 chain_cache_seconds=0)
    server = serve_in_thread(create_app(settings, LedgerChainView(devnet.client())))
    token = settings.admin_token_file.read_text().strip()
    yield server.url, token
    server.stop()


def put(url: str, signer: Wallet, meta: NodeMetadata) -> httpx.Response:
    return httpx.put(f"{url}/nodes", content=meta.model_dump_json(), auth=SignedAuth(signer),
                     headers={"Content-Type": "application/json"})


def test_registered_node_uploads_and_manager_sees_it(devnet, service):
    url, _ = service
    provider = devnet.new_provider()
    node = devnet.new_node(provider)
    response = put(url, node, metadata(node, provider, port=9001))
    assert response.status_code == 200, response.text
    record = response.json()
    assert record["on_chain"]["registered"] and record["on_chain"]["provider_whitelisted"]
    listed = httpx.get(f"{url}/pools/{devnet.pool_id}/nodes", auth=SignedAuth(devnet.manager))
    assert listed.status_code == 200, listed.text
    assert node.address in [n["metadata"]["node_address"] for n in listed.json()]
    assert all(n["metadata"]["ip_address"] for n in listed.json())  # the manager sees IPs
    # the node may read its own record
    own = httpx.get(f"{url}/nodes/{node.address}", auth=SignedAuth(node))
    assert own.status_code == 200 and own.json()["metadata"]["port"] == 9001


def test_the_p2p_port_is_stored_and_served_and_left_out_when_unset(devnet, service):
    """The worker's own client: a node with a peer inbox advertises its port; one without sends no
    `p2p_port` at all (a discovery older than the field refuses unknown fields)."""
    import asyncio

    from worker.discovery_client import upload_metadata

    url, _ = service
    provider = devnet.new_provider()
    with_inbox, without = devnet.new_node(provider), devnet.new_node(provider)
    advertised = metadata(with_inbox, provider).model_copy(update={"p2p_port": 7001})
    asyncio.run(upload_metadata(url, with_inbox, advertised, 10))
    asyncio.run(upload_metadata(url, without, metadata(without, provider), 10))
    for node, port in ((with_inbox, 7001), (without, None)):
        own = httpx.get(f"{url}/nodes/{node.address}", auth=SignedAuth(node))
        assert own.status_code == 200, own.text
        assert NodeMetadata.model_validate(own.json()["metadata"]).p2p_port == port
    refused = put(url, with_inbox, metadata(with_inbox, provider).model_copy(update={"p2p_port": 70_000}))
    assert refused.status_code == 422 and "p2p_port" in refused.text


def test_an_unset_p2p_port_is_not_sent(monkeypatch):
    import asyncio

    from worker.discovery_client import upload_metadata

    bodies: list[bytes] = []

    async def fake_put(self, path, *, content, headers):
        bodies.append(content)
        return httpx.Response(200, request=httpx.Request("PUT", path))

    monkeypatch.setattr(httpx.AsyncClient, "put", fake_put)
    node, provider = Wallet.create(), Wallet.create()
    asyncio.run(upload_metadata("http://discovery", node, metadata(node, provider), 1))
    asyncio.run(upload_metadata("http://discovery", node, metadata(node, provider).model_copy(
        update={"p2p_port": 7001}), 1))
    assert b"p2p_port" not in bodies[0] and b'"p2p_port":7001' in bodies[1]


def test_upload_refusals_name_the_problem(devnet, service):
    url, _ = service
    provider = devnet.new_provider(whitelist=False)
    node = devnet.new_node(provider)
    stranger = Wallet.create()
    # signed by someone else than the node
    r = put(url, stranger, metadata(node, provider))
    assert r.status_code == 403 and "must be signed by that node's key" in r.json()["detail"]
    # not whitelisted provider
    r = put(url, node, metadata(node, provider))
    assert r.status_code == 403 and "not whitelisted" in r.json()["detail"]
    # unregistered node
    r = put(url, stranger, metadata(stranger, provider))
    assert r.status_code == 403 and "not registered on chain" in r.json()["detail"]
    # wrong provider claimed
    other = devnet.new_provider()
    r = put(url, node, metadata(node, other))
    assert r.status_code == 403 and f"registered under provider {provider.address}" in r.json()["detail"]
    # below the pool's hardware requirements (2 CPU cores)
    devnet.client(devnet.owner).whitelist_provider(provider.address)
    r = put(url, node, metadata(node, provider, cores=1))
    assert r.status_code == 422 and "needs 2 CPU cores, has 1" in r.json()["detail"]
    # bad signature: a body changed after signing
    meta = metadata(node, provider)
    headers = sign_request(node, "PUT", "/nodes", b"{}")
    r = httpx.put(f"{url}/nodes", content=meta.model_dump_json(),
                  headers={**headers, "Content-Type": "application/json"})
    assert r.status_code == 401 and "does not match" in r.json()["detail"]
    # replay of a valid request
    body = meta.model_dump_json().encode()
    headers = {**sign_request(node, "PUT", "/nodes", body), "Content-Type": "application/json"}
    assert httpx.put(f"{url}/nodes", content=body, headers=headers).status_code == 200
    r = httpx.put(f"{url}/nodes", content=body, headers=headers)
    assert r.status_code == 401 and "replayed" in r.json()["detail"]
    # clock skew
    headers = {**sign_request(node, "PUT", "/nodes", body, timestamp=int(time.time()) - 600),
               "Content-Type": "application/json"}
    r = httpx.put(f"{url}/nodes", content=body, headers=headers)
    assert r.status_code == 401 and "off the server clock" in r.json()["detail"]


def test_per_ip_limit(devnet, service):
    url, _ = service
    provider = devnet.new_provider()
    nodes = [devnet.new_node(provider) for _ in range(3)]
    for node in nodes[:2]:
        assert put(url, node, metadata(node, provider, ip="10.0.0.7")).status_code == 200
    r = put(url, nodes[2], metadata(nodes[2], provider, ip="10.0.0.7"))
    assert r.status_code == 409 and "limit 2" in r.json()["detail"]
    # moving one node away frees a slot
    assert put(url, nodes[0], metadata(nodes[0], provider, ip="10.0.0.8")).status_code == 200
    assert put(url, nodes[2], metadata(nodes[2], provider, ip="10.0.0.7")).status_code == 200


def test_access_tiers(devnet, service):
    url, token = service
    provider = devnet.new_provider()
    node = devnet.new_node(provider)
    assert put(url, node, metadata(node, provider)).status_code == 200
    stranger = Wallet.create()
    # nobody else sees IPs
    assert httpx.get(f"{url}/nodes", auth=SignedAuth(stranger)).status_code == 403
    assert httpx.get(f"{url}/pools/{devnet.pool_id}/nodes", auth=SignedAuth(stranger)).status_code == 403
    assert httpx.get(f"{url}/nodes/{node.address}", auth=SignedAuth(stranger)).status_code == 403
    assert httpx.get(f"{url}/nodes").status_code == 401
    # the manager reads its pool but not everything
    assert httpx.get(f"{url}/nodes", auth=SignedAuth(devnet.manager)).status_code == 403
    # admin token reads anything; a wrong token is refused
    everything = httpx.get(f"{url}/nodes", headers={"Authorization": f"Bearer {token}"})
    assert everything.status_code == 200 and node.address in {n["metadata"]["node_address"]
                                                              for n in everything.json()}
    assert httpx.get(f"{url}/nodes", headers={"Authorization": "Bearer x" * 3}).status_code == 403
    # a validator (on-chain role) reads all nodes
    validator = Wallet.create()
    devnet.client(devnet.owner).grant_validator(validator.address)
    assert httpx.get(f"{url}/nodes", auth=SignedAuth(validator)).status_code == 200
    assert httpx.get(f"{url}/nodes/{node.address}", auth=SignedAuth(validator)).status_code == 200
    # unknown pool
    assert httpx.get(f"{url}/pools/999/nodes", auth=SignedAuth(devnet.manager)).status_code == 404


def test_background_sync_refreshes_flags(devnet, service):
    url, token = service
    provider = devnet.new_provider()
    node = devnet.new_node(provider)
    assert put(url, node, metadata(node, provider)).status_code == 200
    devnet.join(provider, node)
    devnet.client(devnet.owner).blacklist_provider(provider.address)
    admin = {"Authorization": f"Bearer {token}"}
    deadline = time.monotonic() + 10
    flags = {}
    while time.monotonic() < deadline:
        flags = httpx.get(f"{url}/nodes/{node.address}", headers=admin).json()["on_chain"]
        if flags["blacklisted"] and flags["pool_id"] == devnet.pool_id:
            break
        time.sleep(0.2)
    assert flags["blacklisted"] and flags["pool_id"] == devnet.pool_id
    # blacklisted nodes are refused on the next upload
    r = put(url, node, metadata(node, provider))
    assert r.status_code == 403 and "blacklisted" in r.json()["detail"]


def test_health_and_metrics(service):
    url, _ = service
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    text = httpx.get(f"{url}/metrics").text
    assert "discovery_uploads_total" in text
    assert httpx.get(f"{url}/openapi.json").json()["paths"]["/nodes"]


def test_the_invite_mailbox_takes_only_the_managers_invites_and_gives_them_only_to_the_node(devnet, service):
    """Issue 21: the way in for a node nobody can call. PUT by the pool's manager only, for the node the
    path names, not expired; GET by that node only; DELETE by the node (or the manager)."""
    from intellect.wire.invites import InviteRequest

    url, _ = service
    node, stranger = Wallet.create(), Wallet.create()
    invite = InviteRequest(domain_id=1, pool_id=devnet.pool_id, node_address=node.address,
                           nonce="0x" + "ab" * 32, expiration=int(time.time()) + 600,
                           signature="0x" + "11" * 65, orchestrator_url="http://10.0.0.1:8090")  # fmt: skip
    box = f"{url}/nodes/{node.address}/invite"

    def leave(signer: Wallet, body: InviteRequest, where: str = box) -> httpx.Response:
        return httpx.put(where, content=body.model_dump_json(), auth=SignedAuth(signer),
                         headers={"Content-Type": "application/json"})  # fmt: skip

    assert httpx.get(box, auth=SignedAuth(node)).status_code == 404  # nothing waits yet
    refused = leave(stranger, invite)
    assert refused.status_code == 403 and "manager" in refused.json()["detail"]
    wrong_node = leave(devnet.manager, invite, f"{url}/nodes/{stranger.address}/invite")
    assert wrong_node.status_code == 400 and "not " + stranger.address in wrong_node.json()["detail"]
    expired = leave(devnet.manager, invite.model_copy(update={"expiration": int(time.time()) - 1}))
    assert expired.status_code == 400 and "expired" in expired.json()["detail"]
    assert leave(devnet.manager, invite).status_code == 204
    other = httpx.get(box, auth=SignedAuth(stranger))
    assert other.status_code == 403 and f"only {node.address} may read" in other.json()["detail"]
    mine = httpx.get(box, auth=SignedAuth(node))
    assert mine.status_code == 200 and InviteRequest.model_validate(mine.json()) == invite
    assert httpx.delete(box, auth=SignedAuth(stranger)).status_code == 403
    assert httpx.delete(box, auth=SignedAuth(node)).status_code == 204
    assert httpx.get(box, auth=SignedAuth(node)).status_code == 404
