"""Put a fresh chain into demo shape: contracts deployed, role accounts funded and whitelisted, a
domain and a started pool. Used by `intellect devnet up` (on the anvil it starts) and by the
docker-compose `deploy` job (on the anvil service), so both networks are built the same way.

Idempotent: when `out_dir` already records a deployment that still has code on the chain, nothing
is sent again and the recorded result is returned (a restarted deploy job is a no-op).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from eth_account import Account
from pydantic import BaseModel

from intellect.identity import Wallet
from ledger.client import LedgerClient
from ledger.deploy import Deployment, DeployParams, deploy_all
from ledger.models import ONE_TOKEN

# Roles of the demo accounts, in derivation order (m/44'/60'/0'/0/i of the chain's mnemonic).
ROLES = (
    "deployer",
    "pool-manager",
    "validator",
    "trainer",
    "provider-1",
    "provider-2",
    "provider-3",
    "node-1",
    "node-2",
    "node-3",
    "validator-2",
    "validator-3",
    "provider-4",
    "node-4",
    "provider-5",  # 5 and 6: two 3-member groups (`up --demo --pipeline 3`)
    "node-5",
    "provider-6",
    "node-6",
    # 7 to 13: the fire scenario's roster (`intellect devnet fire`: groups, single nodes, a cheater of
    # every kind, each on its own node)
    *(f"{kind}-{i}" for i in range(7, 14) for kind in ("provider", "node")),
)
DEMO_TOKENS = 100_000
# Parsed by intellect.wire.requirements (see docs/orchestrator.md): CPU-only demo hosts qualify.
DEMO_POOL_REQUIREMENTS = {"requirements": {"ram_mb": 1024, "disk_free_mb": 1024}}

Progress = Callable[[str], None]


class Bootstrapped(BaseModel):
    rpc_url: str
    chain_id: int
    deployment_path: str
    domain_id: int
    pool_id: int


def role_keys(mnemonic: str, roles: tuple[str, ...] = ROLES) -> dict[str, str]:
    """Private keys (0x hex) of each role, derived from `mnemonic` as anvil derives its accounts."""
    Account.enable_unaudited_hdwallet_features()
    return {
        role: "0x" + bytes(Account.from_mnemonic(mnemonic, account_path=f"m/44'/60'/0'/0/{i}").key).hex()
        for i, role in enumerate(roles)
    }


def new_mnemonic() -> str:
    """A fresh 12-word BIP-39 mnemonic (for a compose env file: never a committed default)."""
    Account.enable_unaudited_hdwallet_features()
    _, mnemonic = Account.create_with_mnemonic()  # 128 bits from the OS's random source
    return str(mnemonic)


class PoolOnChain(NamedTuple):
    deployment: Deployment
    domain_id: int
    pool_id: int


def start_pool_on_chain(
    rpc_url: str,
    deployer: Wallet,
    manager: Wallet,
    *,
    creator: Wallet | None = None,
    params: DeployParams | None = None,
    domain: tuple[str, str] = ("test-domain", ""),
    pool_name: str = "test-pool",
    pool_data_uri: str = "",
) -> PoolOnChain:
    """The one network starter on a chain: every contract deployed by `deployer`, a domain (name,
    parameters URI), and a started pool created by `creator` (default: the manager) whose manager
    (the key that signs invites) is `manager`.
    The devnet (`bootstrap`), the compose deploy job and the test harness
    (`tests/support/testing.start_devnet`) all build their pool here."""
    deployment = deploy_all(rpc_url, deployer, params or DeployParams())
    admin = LedgerClient(rpc_url, deployment, deployer)
    domain_id = admin.create_domain(*domain)
    pools = admin.with_wallet(creator or manager)
    pool_id = pools.create_pool(domain_id, manager.address, pool_name, pool_data_uri, compute_limit=0)
    pools.start_pool(pool_id)
    return PoolOnChain(deployment, domain_id, pool_id)


def bootstrap(
    rpc_url: str, wallets: dict[str, Wallet], out_dir: Path, progress: Progress = print
) -> Bootstrapped:
    out_dir.mkdir(parents=True, exist_ok=True)
    record = out_dir / "bootstrap.json"
    if record.exists():
        done = Bootstrapped.model_validate_json(record.read_text())
        try:
            LedgerClient(rpc_url, Path(done.deployment_path)).check()
            progress(f"chain already bootstrapped (pool {done.pool_id}); nothing to do")
            return done
        except Exception as exc:  # a new chain under an old record: build again
            progress(f"recorded deployment is not on this chain ({exc}); deploying again")
    progress("deploying contracts, creating the demo domain and pool")
    validators = [w.address for r, w in wallets.items() if r.startswith("validator")]
    chain = start_pool_on_chain(
        rpc_url,
        wallets["deployer"],
        wallets["pool-manager"],
        params=DeployParams(validators=validators),
        domain=("demo-rl", 'data:application/json,{"task":"synthetic"}'),
        pool_name="demo-pool",
        pool_data_uri="data:application/json," + json.dumps(DEMO_POOL_REQUIREMENTS, separators=(",", ":")),
    )
    deployment, domain_id, pool_id = chain
    deployment_path = deployment.save(out_dir / "deployment.json")
    admin = LedgerClient(rpc_url, deployment, wallets["deployer"])
    progress("funding demo accounts")
    for role, wallet in wallets.items():
        if role == "deployer":
            continue
        admin.mint(wallet.address, DEMO_TOKENS * ONE_TOKEN)
        if role.startswith("provider-"):
            admin.whitelist_provider(wallet.address)
    done = Bootstrapped(
        rpc_url=rpc_url,
        chain_id=deployment.chain_id,
        deployment_path=str(deployment_path),
        domain_id=domain_id,
        pool_id=pool_id,
    )
    record.write_text(done.model_dump_json(indent=2))
    return done
