"""A node's unmatured reward locks are capped (`MAX_LIVE_LOCKS`), so that its slash, which drops every one
of them, always fits a block: otherwise a node could submit until slashing it ran out of gas and its
rewards matured unjudged. Real anvil; the locks are filled with raw transactions sent back to back."""

from __future__ import annotations

import hashlib

import pytest
from ledger_world import World

from ledger.client import LedgerClient
from ledger.errors import ContractRevert
from ledger.models import ONE_TOKEN

DAY = 24 * 3600
BLOCK_GAS = 30_000_000  # a mainnet-sized block; anvil's default is the same


def key(i: int) -> bytes:
    return hashlib.sha256(f"lock-file-{i}".encode()).digest()


def fill(sender: LedgerClient, pool_id: int, node: str, count: int) -> None:
    """`count` single submissions (one lock each), signed locally and sent without waiting for each."""
    w3, pools = sender.w3, sender.pools
    assert sender.wallet is not None
    account = sender.wallet.account
    nonce = w3.eth.get_transaction_count(account.address, "pending")
    chain_id, base = w3.eth.chain_id, int(w3.eth.get_block("latest")["baseFeePerGas"])
    hashes = []
    for i in range(count):
        tx = {"to": pools.address, "data": pools.encode_abi("submitWork", [pool_id, node, key(i), 1]),
              "nonce": nonce + i, "gas": 400_000, "chainId": chain_id, "type": 2,
              "maxFeePerGas": 4 * base + 10**9, "maxPriorityFeePerGas": 10**9}
        hashes.append(w3.eth.send_raw_transaction(account.sign_transaction(tx).raw_transaction))
    for tx_hash in (hashes[0], hashes[-1]):
        assert w3.eth.wait_for_transaction_receipt(tx_hash, timeout=300)["status"] == 1


def test_a_node_at_the_cap_is_refused_until_its_locks_mature(world: World) -> None:
    world.onboard(world.provider, world.node, stake=1000 * ONE_TOKEN)
    node, pool = world.node.address, world.pool_id
    cap = world.admin.pools.functions.MAX_LIVE_LOCKS().call()
    assert cap == 2048
    fill(world.provider, pool, node, cap)
    assert world.admin.file_count(pool) == cap
    with pytest.raises(ContractRevert, match=r"^TooManyLiveLocks\("):
        world.provider.submit_work(pool, node, key(cap), 1)
    with pytest.raises(ContractRevert, match=r"^TooManyLiveLocks\("):  # a batch takes a lock too
        world.provider.submit_work_batch(pool, node, [(key(cap), 1), (key(cap + 1), 1)])
    # once the lock period has passed, the next submission matures the old locks and goes through
    world.chain.increase_time(DAY + 60)
    assert world.provider.submit_work(pool, node, key(cap), 1).status == 1
    assert world.admin.pending_rewards(node) == 1 * ONE_TOKEN  # only the new file is still locked


def test_slashing_a_node_at_the_cap_fits_a_block(world: World) -> None:
    world.onboard(world.provider, world.node, stake=1000 * ONE_TOKEN)
    node, pool = world.node.address, world.pool_id
    cap = world.admin.pools.functions.MAX_LIVE_LOCKS().call()
    fill(world.provider, pool, node, cap)
    result = world.validator.invalidate_work(pool, key(cap // 2))
    ev = result.event("WorkInvalidated")
    assert ev is not None and ev.args["rewardsDropped"] == cap * ONE_TOKEN  # every lock dropped
    print(f"slash with {cap} live locks: {result.gas_used:,} gas")
    assert result.gas_used < BLOCK_GAS // 2
    assert world.admin.pending_rewards(node) == 0
