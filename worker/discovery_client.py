"""Upload this node's metadata to discovery (`PUT /nodes`, signed by the node key)."""

from __future__ import annotations

import httpx

from intellect.errors import PeerRefused
from intellect.identity import Wallet
from intellect.signing import SignedAuth
from intellect.wire.nodes import NodeMetadata


async def upload_metadata(discovery_url: str, node: Wallet, metadata: NodeMetadata, timeout: float) -> None:
    body = metadata.model_dump_json().encode()
    async with httpx.AsyncClient(base_url=discovery_url, timeout=timeout, auth=SignedAuth(node)) as client:
        response = await client.put("/nodes", content=body, headers={"Content-Type": "application/json"})
    if 400 <= response.status_code < 500:
        raise PeerRefused.from_response(response, f"discovery {discovery_url}")
    response.raise_for_status()
