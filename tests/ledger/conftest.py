"""Fixtures: one real anvil and one deployment per session; every test runs between an
evm_snapshot and an evm_revert, so tests see the same fresh state and cannot leak into each other."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ledger_world import STAKE_MIN, World

from intellect.identity import Wallet
from ledger.client import LedgerClient
from ledger.deploy import DeployParams, deploy_all
from ledger.dev.anvil import Anvil
from ledger.models import ONE_TOKEN


@pytest.fixture(scope="session")
def chain() -> Iterator[Anvil]:
    with Anvil.start() as anvil:
        yield anvil


@pytest.fixture(scope="session")
def world_snapshot(chain: Anvil) -> tuple[World, str]:
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
    return world, chain.snapshot()


@pytest.fixture()
def world(world_snapshot: tuple[World, str]) -> Iterator[World]:
    w, _ = world_snapshot
    snap = w.chain.snapshot()
    try:
        yield w
    finally:
        w.chain.revert(snap)
