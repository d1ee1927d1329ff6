"""A contributor's whole lifecycle through `intellect-worker`, on its own real anvil (it travels in time).

start (register, stake) → invite (join) → work → deregister (stops the daemon, leaves, unbonds) →
evm_increaseTime past unbonding and the reward lock → claim → the provider's tokens are back, plus the
rewards, and its ETH is down by exactly the gas of its own transactions.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner
from worker_devnet import POOL_DATA

from intellect.identity import Wallet
from intellect.net import free_port
from intellect.signing import SignedAuth
from intellect.wire.invites import InviteRequest
from ledger.client import LedgerClient
from ledger.deploy import DeployParams, deploy_all
from ledger.dev.anvil import Anvil
from ledger.invites import sign_invite
from ledger.models import ONE_TOKEN
from worker.chain import WorkerChain
from worker.cli import app
from worker.keys import WorkerKeys
from worker.pidfile import running_daemon

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
STAKE = 20 * ONE_TOKEN  # the registry asks (units + 1) x the 10-token minimum for one unit


@pytest.fixture()
def chain(tmp_path: Path) -> Iterator[tuple[Anvil, Path, LedgerClient, Wallet, int, int]]:
    anvil = Anvil.start(accounts=3)
    try:
        deployer, manager = (Wallet.from_key(k) for k in anvil.dev_keys[:2])
        deployment = deploy_all(anvil.rpc_url, deployer, DeployParams(stake_minimum=10 * ONE_TOKEN))
        path = deployment.save(tmp_path / "deployment.json")
        admin = LedgerClient(anvil.rpc_url, path, deployer)
        domain_id = admin.create_domain("rl", "")
        pool_id = admin.create_pool(domain_id, manager.address, "pool", POOL_DATA, 0)
        admin.start_pool(pool_id)
        yield anvil, path, admin, manager, domain_id, pool_id
    finally:
        anvil.stop()


def said(result: object) -> str:
    """The CLI's message with rich's line wrapping undone."""
    return " ".join(getattr(result, "output", "").split())


def gas_paid_by(client: LedgerClient, address: str, from_block: int) -> int:
    """Wei spent on gas by `address` in blocks after `from_block` (every transaction it sent)."""
    total = 0
    for number in range(from_block + 1, client.block_number() + 1):
        for tx in client.w3.eth.get_block(number, full_transactions=True)["transactions"]:
            if tx["from"] == address:
                receipt = client.w3.eth.get_transaction_receipt(tx["hash"])
                total += receipt["gasUsed"] * receipt["effectiveGasPrice"]
    return total


def test_register_join_work_deregister_claim(chain, tmp_path: Path) -> None:
    anvil, deployment, admin, manager, domain_id, pool_id = chain
    provider, node = Wallet.create(), Wallet.create()
    anvil.rpc("anvil_setBalance", [provider.address, hex(10**20)])
    admin.mint(provider.address, 100 * ONE_TOKEN)
    start_block = admin.block_number()
    eth_before, tokens_before = admin.eth_balance(provider.address), admin.balance_of(provider.address)

    state = tmp_path / "worker"
    port = free_port("127.0.0.1")
    env = {
        **os.environ, "PYTHONPATH": str(REPO), "INTELLECT_WORKER_STATE_DIR": str(state),
        "INTELLECT_KEYSTORE_PASSPHRASE": "pw", "INTELLECT_WORKER_RPC_URL": anvil.rpc_url,
        "INTELLECT_WORKER_DEPLOYMENT": str(deployment), "INTELLECT_WORKER_POOL_ID": str(pool_id),
        "INTELLECT_WORKER_PROVIDER_KEY": provider.private_key_hex(),
        "INTELLECT_WORKER_NODE_KEY": node.private_key_hex(),
        "INTELLECT_WORKER_DISCOVERY_URL": "http://127.0.0.1:9",
    }
    daemon = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "start", "--yes", "--api-port", str(port),
         "--runtime", "recording"],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=(tmp_path / "worker.err").open("wb"),
    )
    try:
        # 1. start registers and serves the API.
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert daemon.poll() is None, (tmp_path / "worker.err").read_text()
            assert time.monotonic() < deadline, "worker API did not come up"
            time.sleep(0.2)
        assert running_daemon(state) == daemon.pid

        # 2. the manager invites; the worker joins on chain.
        nonce, expiration = secrets.randbits(128), admin.timestamp() + 600
        invite = sign_invite(manager, domain_id, pool_id, node.address, nonce, expiration)
        body = InviteRequest(domain_id=domain_id, pool_id=pool_id, node_address=node.address,
                             nonce=f"0x{nonce:064x}", expiration=expiration, signature=invite.signature,
                             orchestrator_url="http://127.0.0.1:9/").model_dump_json()
        reply = httpx.post(f"http://127.0.0.1:{port}/invite", content=body, auth=SignedAuth(manager),
                           headers={"Content-Type": "application/json"}, timeout=30)
        assert reply.status_code == 200, reply.text
        assert admin.is_node_in_pool(pool_id, node.address)

        # 3. work, submitted as the uploader does (provider key).
        worker_chain = WorkerChain(anvil.rpc_url, deployment, WorkerKeys(provider, node))
        worker_chain.work(pool_id).submit(hashlib.sha256(b"result").hexdigest(), 3)
        status = json.loads(runner.invoke(app, ["status", "--json"], env=env).stdout)["chain"]
        assert status["pool"] == {"id": pool_id, "member": True, "reason": None}
        assert status["stake"] == STAKE and status["rewards_pending"] == 3 * ONE_TOKEN
        early = runner.invoke(app, ["claim"], env=env)
        assert early.exit_code == 1 and provider.address in said(early) and "still locked" in said(early)

        # 4. deregister stops the daemon, leaves, removes the node and unbonds.
        out = runner.invoke(app, ["deregister", "--yes", "--json"], env=env)
        assert out.exit_code == 0, out.output
        result = json.loads(out.stdout)
        assert result["daemon_stopped"] == daemon.pid and len(result["transactions"]) == 3
        assert daemon.wait(timeout=5) == 0 and running_daemon(state) is None
        [unbond] = result["unbonding"]
        assert unbond["amount"] == STAKE and unbond["release_at"] > admin.timestamp()
        after = json.loads(runner.invoke(app, ["status", "--json"], env=env).stdout)["chain"]
        assert after["pool"]["member"] is False and "not registered" in after["pool"]["reason"]
        assert after["stake"] == 0 and [u["claimable"] for u in after["unbonding"]] == [False]
        too_soon = runner.invoke(app, ["claim"], env=env)
        assert too_soon.exit_code == 1 and provider.address in said(too_soon)
        assert "unbond at" in said(too_soon)

        # 5. time travel past the unbonding period and the reward lock, then claim both.
        anvil.rpc("evm_increaseTime", [unbond["release_at"] - admin.timestamp() + 1])
        anvil.rpc("evm_mine", [])
        claimed = runner.invoke(app, ["claim", "--json"], env=env)
        assert claimed.exit_code == 0, claimed.output
        rows = {r["kind"]: r for r in json.loads(claimed.stdout)}
        assert rows["stake"]["amount"] == STAKE and rows["rewards"]["amount"] == 3 * ONE_TOKEN
        assert all(r["tx_hash"].startswith("0x") and r["gas_used"] > 0 for r in rows.values())
        again = runner.invoke(app, ["claim"], env=env)
        assert again.exit_code == 1 and "nothing to claim" in said(again)

        # 6. everything back: tokens + rewards; ETH down by exactly the provider's gas.
        assert admin.balance_of(provider.address) == tokens_before + 3 * ONE_TOKEN
        gas = gas_paid_by(admin, provider.address, start_block)
        assert gas > 0 and admin.eth_balance(provider.address) == eth_before - gas
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
