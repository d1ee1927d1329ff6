"""Signatures the contracts check: the pool manager's invite and the node key's ownership proof.

Both are EIP-191 `personal_sign` over a 32-byte keccak digest of packed arguments, exactly what
`ComputePool.inviteDigest` and `ComputeRegistry.addNode` recompute on chain.
"""

from __future__ import annotations

from eth_utils import keccak, to_checksum_address
from pydantic import BaseModel, ConfigDict, field_serializer, field_validator

from intellect.identity import Wallet, recover_message
from intellect.wire.invites import NONCE_HEX, nonce_hex


def _u256(value: int) -> bytes:
    if value < 0 or value >= 2**256:
        raise ValueError("value out of uint256 range")
    return value.to_bytes(32, "big")


def invite_digest(domain_id: int, pool_id: int, node: str, nonce: int, expiration: int) -> bytes:
    """keccak256(abi.encodePacked(domainId, poolId, node, nonce, expiration)); uint256s and an address."""
    packed = _u256(domain_id) + _u256(pool_id) + bytes.fromhex(to_checksum_address(node)[2:]) + _u256(nonce)
    return keccak(packed + _u256(expiration))


class Invite(BaseModel):
    """A pool manager's signed permission for `node` to join `pool_id`, once, before `expiration`."""

    model_config = ConfigDict(frozen=True)

    domain_id: int
    pool_id: int
    node: str
    nonce: int
    expiration: int  # unix seconds
    signature: str  # 0x hex, 65 bytes

    @field_validator("node")
    @classmethod
    def _checksum(cls, v: str) -> str:
        return to_checksum_address(v)

    @field_validator("nonce", mode="before")
    @classmethod
    def _nonce_from_hex(cls, v: object) -> object:
        """JSON carries the nonce as the worker's API does: 0x + 64 hex digits (an int is taken too)."""
        if isinstance(v, str):
            if not NONCE_HEX.fullmatch(v):
                raise ValueError(f"nonce {v!r} must be 0x + 64 hex digits (32 bytes)")
            return int(v, 16)
        return v

    @field_serializer("nonce")
    def _nonce_to_hex(self, v: int) -> str:
        return nonce_hex(v)

    def digest(self) -> bytes:
        return invite_digest(self.domain_id, self.pool_id, self.node, self.nonce, self.expiration)

    def signer(self) -> str:
        """The address that signed this invite (compare with the pool's manager)."""
        return recover_message(self.digest(), self.signature)


def sign_invite(
    manager: Wallet, domain_id: int, pool_id: int, node: str, nonce: int, expiration: int
) -> Invite:
    digest = invite_digest(domain_id, pool_id, node, nonce, expiration)
    return Invite(
        domain_id=domain_id,
        pool_id=pool_id,
        node=node,
        nonce=nonce,
        expiration=expiration,
        signature=manager.sign_hash(digest),
    )


def node_ownership_digest(provider: str, node: str) -> bytes:
    """keccak256(abi.encodePacked(address provider, address node))."""
    return keccak(
        bytes.fromhex(to_checksum_address(provider)[2:]) + bytes.fromhex(to_checksum_address(node)[2:])
    )


def sign_node_ownership(node: Wallet, provider: str) -> str:
    """The node key's consent to be added under `provider` (ComputeRegistry.addNode's signature)."""
    return node.sign_hash(node_ownership_digest(provider, node.address))
