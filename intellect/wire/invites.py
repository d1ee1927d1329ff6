"""The invite a pool's orchestrator POSTs to a worker's API (signed request by the manager key)."""

from __future__ import annotations

import re

from pydantic import Field

from intellect.wire.base import WireModel

NONCE_HEX = re.compile(r"0x[0-9a-fA-F]{64}")
"""An invite nonce as text, everywhere (the worker's invite API, `intellect-pool invite --json`)."""


def nonce_hex(nonce: int) -> str:
    """The text form of an invite nonce: 0x + 64 hex digits (32 bytes, big-endian)."""
    return "0x" + nonce.to_bytes(32, "big").hex()


class InviteRequest(WireModel):
    domain_id: int = Field(ge=0)
    pool_id: int = Field(ge=0)
    node_address: str
    nonce: str = Field(pattern=rf"^{NONCE_HEX.pattern}$", description="32 random bytes, single use on chain")
    expiration: int = Field(description="unix seconds after which the contract refuses the invite")
    signature: str = Field(pattern=r"^0x[0-9a-fA-F]{130}$", description="manager key's EIP-191 signature")
    orchestrator_url: str = Field(description="where the node sends heartbeats and upload requests")


class InviteResponse(WireModel):
    accepted: bool
    detail: str | None = None
    tx_hash: str | None = None
