"""Worker test fixtures: one real anvil with the contracts, a started pool and funded provider keys."""

from __future__ import annotations

import pytest
from worker_devnet import POOL_DATA, Devnet, ServerThread

from intellect.identity import Wallet
from ledger.client import LedgerClient
from ledger.deploy import DeployParams, deploy_all
from ledger.dev.anvil import Anvil
from ledger.models import ONE_TOKEN


@pytest.fixture(scope="session")
def devnet(tmp_path_factory: pytest.TempPathFactory):
    anvil = Anvil.start(accounts=10)
    try:
        keys = anvil.dev_keys
        deployer, manager, validator = (Wallet.from_key(k) for k in keys[:3])
        deployment = deploy_all(anvil.rpc_url, deployer, DeployParams(stake_minimum=10 * ONE_TOKEN))
        path = deployment.save(tmp_path_factory.mktemp("chain") / "deployment.json")
        admin = LedgerClient(anvil.rpc_url, path, deployer)
        admin.grant_validator(validator.address)
        domain_id = admin.create_domain("rl", "")
        pool_id = admin.create_pool(domain_id, manager.address, "pool", POOL_DATA, 0)
        admin.start_pool(pool_id)
        providers = keys[3:]
        for key in providers:
            admin.mint(Wallet.from_key(key).address, 1000 * ONE_TOKEN)
        yield Devnet(anvil, path, admin, manager, validator, pool_id, domain_id, providers)
    finally:
        anvil.stop()


@pytest.fixture(scope="session")
def server_thread() -> type[ServerThread]:
    return ServerThread
