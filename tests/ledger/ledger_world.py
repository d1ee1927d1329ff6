"""The test world of the ledger tests: actors, a started pool, and a few shortcuts."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass

import pytest

from intellect.identity import Wallet
from ledger.client import LedgerClient
from ledger.deploy import Deployment, DeployParams, deploy_all
from ledger.dev.anvil import Anvil
from ledger.errors import ContractRevert
from ledger.invites import Invite, sign_invite
from ledger.models import ONE_TOKEN

STAKE_MIN = 10 * ONE_TOKEN


def reverts(name: str) -> AbstractContextManager[pytest.ExceptionInfo[ContractRevert]]:
    """Expects the call in the block to revert with the contract's custom error `name`."""
    return pytest.raises(ContractRevert, match=rf"^{name}\(")


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


def build_world(chain: Anvil) -> World:
    """Contracts deployed on `chain`, actors funded, a domain and a started pool."""
    keys = chain.dev_keys
    admin_w, provider_w, validator_w, provider2_w, manager_w, stranger_w = (
        Wallet.from_key(k) for k in keys[:6]
    )
    params = DeployParams(stake_minimum=STAKE_MIN, validators=[validator_w.address])
    deployment = deploy_all(chain.rpc_url, admin_w, params)
    admin = LedgerClient(chain.rpc_url, deployment, admin_w)
    for w in (provider_w, provider2_w, stranger_w):
        admin.mint(w.address, 10_000 * ONE_TOKEN)
    domain_id = admin.create_domain("math", "file:///domains/math.json")
    pool_id = admin.create_pool(domain_id, manager_w.address, "pool-1", "file:///pool.json", 0)
    admin.start_pool(pool_id)
    node = Wallet.from_key("0x" + "11" * 32)
    node2 = Wallet.from_key("0x" + "22" * 32)
    for n in (node, node2):  # nodes pay gas when they submit work themselves
        chain.rpc("anvil_setBalance", [n.address, hex(10**20)])
    world = World(
        chain=chain, deployment=deployment, admin=admin, manager=manager_w,
        provider=admin.with_wallet(provider_w), provider2=admin.with_wallet(provider2_w),
        validator=admin.with_wallet(validator_w), stranger=admin.with_wallet(stranger_w),
        node=node, node2=node2, domain_id=domain_id, pool_id=pool_id,
    )  # fmt: skip
    return world
