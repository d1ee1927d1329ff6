"""Upload this node's metadata to discovery (`PUT /nodes`, signed by the node key)."""

from __future__ import annotations

import httpx

from intellect.identity import Wallet
from intellect.signing import SignedAuth
from intellect.wire.nodes import NodeMetadata


class DiscoveryRejected(Exception):
    """Discovery answered 4xx: the reason names what to fix (not registered, requirements, ...)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"discovery refused the metadata ({status}): {reason}")
        self.status = status
        self.reason = reason


def _reason(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text
    return detail if isinstance(detail, str) else str(detail)


async def upload_metadata(discovery_url: str, node: Wallet, metadata: NodeMetadata, timeout: float) -> None:
    body = metadata.model_dump_json().encode()
    async with httpx.AsyncClient(base_url=discovery_url, timeout=timeout, auth=SignedAuth(node)) as client:
        response = await client.put("/nodes", content=body, headers={"Content-Type": "application/json"})
    if 400 <= response.status_code < 500:
        raise DiscoveryRejected(response.status_code, _reason(response))
    response.raise_for_status()
