"""The test world of the ledger tests: actors, a started pool, and a few shortcuts."""

from __future__ import annotations

from dataclasses import dataclass

from intellect.identity import Wallet
from ledger.client import LedgerClient
from ledger.deploy import Deployment
from ledger.dev.anvil import Anvil
from ledger.invites import Invite, sign_invite
from ledger.models import ONE_TOKEN

STAKE_MIN = 10 * ONE_TOKEN


@dataclass
class World:
    """The actors and a started pool, as the tests find them."""

    chain: Anvil
    deployment: Deployment
    admin: LedgerClient  # deployer: admin, federator, minter, pool creator
    manager: Wallet  # signs the pool's invites
    provider: LedgerClient
    provider2: LedgerClient
    validator: LedgerClient
    stranger: LedgerClient
    node: Wallet
    node2: Wallet
    domain_id: int
    pool_id: int

    def invite(self, node: str, nonce: int = 1, ttl: int = 3600, pool_id: int | None = None) -> Invite:
        pool_id = self.pool_id if pool_id is None else pool_id
        return sign_invite(self.manager, self.domain_id, pool_id, node, nonce, self.admin.timestamp() + ttl)

    def node_client(self, node: Wallet) -> LedgerClient:
        return self.admin.with_wallet(node)

    def onboard(
        self,
        provider: LedgerClient,
        node: Wallet,
        units: int = 10,
        stake: int = 1000 * ONE_TOKEN,
        nonce: int = 1,
    ) -> None:
        """Register (if needed), add the node and join the started pool."""
        if not provider.get_provider(provider.address).registered:
            provider.register_provider(stake)
        provider.add_node(node, units)
        provider.join_pool(self.pool_id, node.address, self.invite(node.address, nonce))
