"""The orchestrator's ledger actions, all with the pool manager's key (sync web3: run in a thread)."""

from __future__ import annotations

import secrets
import time
from typing import Protocol

from intellect.identity import Wallet
from ledger.client import LedgerClient
from ledger.errors import ContractRevert, LedgerError
from ledger.invites import Invite, sign_invite


class PoolChain(Protocol):
    pool_id: int
    domain_id: int
    manager: Wallet

    def pool_nodes(self) -> list[str]: ...
    def eject(self, node: str) -> str | None: ...
    def blacklist(self, node: str) -> str | None: ...
    def is_blacklisted(self, node: str) -> bool: ...
    def invite(self, node: str, valid_seconds: int) -> Invite: ...


class LedgerPoolChain:
    def __init__(self, client: LedgerClient, pool_id: int, manager: Wallet) -> None:
        self.client = client
        self.pool_id = pool_id
        self.manager = manager
        pool = client.get_pool(pool_id)
        if pool.manager != manager.address:
            raise LedgerError(f"{manager.address} is not pool {pool_id}'s manager ({pool.manager}): "
                              "configure the manager key")
        self.domain_id = int(pool.domain_id)

    def pool_nodes(self) -> list[str]:
        return list(self.client.pool_nodes(self.pool_id))

    def eject(self, node: str) -> str | None:
        """Eject `node`; None when it was no longer in the pool (nothing to do)."""
        try:
            return self.client.eject_node(self.pool_id, node).tx_hash
        except ContractRevert as exc:
            if exc.error_name == "NodeNotInPool":
                return None
            raise

    def blacklist(self, node: str) -> str | None:
        return self.client.blacklist_node(self.pool_id, node).tx_hash

    def is_blacklisted(self, node: str) -> bool:
        """Blacklisted in this pool: by its owner, or by a slash for invalid work."""
        return bool(self.client.is_node_blacklisted(self.pool_id, node))

    def invite(self, node: str, valid_seconds: int) -> Invite:
        nonce = int.from_bytes(secrets.token_bytes(32), "big")
        return sign_invite(self.manager, self.domain_id, self.pool_id, node, nonce,
                           int(time.time()) + valid_seconds)
