"""This node's calls to discovery, signed by the node key: publish its metadata (`PUT /nodes`), and
fetch and drop the invite a pool left for it (`/nodes/{address}/invite`: the way in for a node behind
NAT, whose own API nobody can call)."""

from __future__ import annotations

import httpx

from intellect.errors import PeerRefused
from intellect.identity import Wallet
from intellect.signing import SignedAuth
from intellect.wire.invites import InviteRequest
from intellect.wire.nodes import NodeMetadata


async def upload_metadata(discovery_url: str, node: Wallet, metadata: NodeMetadata, timeout: float) -> None:
    # An unset p2p port is left out rather than sent as null: a discovery older than the field (unknown
    # fields are refused) still takes the upload of a worker that does not use it.
    # Optional fields left unset are left out, so a discovery older than them still accepts the upload.
    unset = {name for name in ("p2p_port", "throughput") if getattr(metadata, name) is None}
    body = metadata.model_dump_json(exclude=unset or None).encode()
    async with httpx.AsyncClient(base_url=discovery_url, timeout=timeout, auth=SignedAuth(node)) as client:
        response = await client.put("/nodes", content=body, headers={"Content-Type": "application/json"})
    if 400 <= response.status_code < 500:
        raise PeerRefused.from_response(response, f"discovery {discovery_url}")
    response.raise_for_status()


async def fetch_invite(discovery_url: str, node: Wallet, timeout: float) -> InviteRequest | None:
    """The invite waiting for this node at discovery, or None."""
    async with httpx.AsyncClient(base_url=discovery_url, timeout=timeout, auth=SignedAuth(node)) as client:
        response = await client.get(f"/nodes/{node.address}/invite")
    if response.status_code == 404:
        return None
    if 400 <= response.status_code < 500:
        raise PeerRefused.from_response(response, f"discovery {discovery_url}")
    response.raise_for_status()
    return InviteRequest.model_validate_json(response.content)


async def drop_invite(discovery_url: str, node: Wallet, timeout: float) -> None:
    async with httpx.AsyncClient(base_url=discovery_url, timeout=timeout, auth=SignedAuth(node)) as client:
        response = await client.delete(f"/nodes/{node.address}/invite")
    if response.status_code >= 500:
        response.raise_for_status()
