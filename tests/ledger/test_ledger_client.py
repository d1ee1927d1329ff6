"""Client plumbing: chain/code checks, revert decoding, concurrent senders, event reader, artifacts."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from ledger_world import World
from web3.exceptions import TransactionNotFound

from intellect.identity import Wallet
from intellect.settings import PROJECT_ROOT
from ledger.client import LedgerClient
from ledger.errors import ContractRevert, LedgerConfigError
from ledger.events import (
    EventReader,
    NodeEjectedEvent,
    NodeJoinedEvent,
    WorkInvalidatedEvent,
    WorkSubmittedEvent,
)
from ledger.models import ONE_TOKEN


def key(i: int) -> bytes:
    return hashlib.sha256(f"ev-{i}".encode()).digest()


def test_client_refuses_wrong_chain_and_missing_code(world: World) -> None:
    wrong_chain = world.deployment.model_copy(update={"chain_id": 1})
    with pytest.raises(LedgerConfigError, match="chain id 31337"):
        LedgerClient(world.chain.rpc_url, wrong_chain)
    addrs = dict(world.deployment.addresses, ComputePool=Wallet.create().address)
    with pytest.raises(LedgerConfigError, match="no contract code for ComputePool"):
        LedgerClient(world.chain.rpc_url, world.deployment.model_copy(update={"addresses": addrs}))
    with pytest.raises(LedgerConfigError, match="cannot reach"):
        LedgerClient("http://127.0.0.1:1", world.deployment, timeout=2)


def test_deployment_roundtrip(world: World, tmp_path) -> None:
    path = world.deployment.save(tmp_path / "d.json")
    loaded = type(world.deployment).load(path)
    assert loaded == world.deployment
    client = LedgerClient(world.chain.rpc_url, path)
    assert client.stake_minimum() == world.deployment.params.stake_minimum
    with pytest.raises(LedgerConfigError, match="no deployment file"):
        type(world.deployment).load(tmp_path / "missing.json")


def test_reverts_decode_on_calls_and_transactions(world: World) -> None:
    with pytest.raises(ContractRevert) as exc:
        world.admin.get_pool(77)  # eth_call
    assert exc.value.error_name == "PoolNotFound" and exc.value.error_args == {"poolId": 77}
    with pytest.raises(ContractRevert) as exc:
        world.stranger.mint(world.stranger.address, 1)  # estimate_gas of a transaction
    assert exc.value.error_name == "AccessControlUnauthorizedAccount"
    assert exc.value.error_args["account"] == world.stranger.address
    with pytest.raises(ContractRevert) as exc:  # OpenZeppelin's ERC20 errors decode too
        world.stranger.transfer(world.admin.address, 10**30)
    assert exc.value.error_name == "ERC20InsufficientBalance"


def test_mined_revert_is_decoded(world: World) -> None:
    """A transaction that passes estimation but reverts when mined still names its error."""
    from ledger.tx import TxSender

    sender = TxSender(world.admin.w3, world.stranger.wallet, chain_key="test", timeout=10)  # type: ignore[arg-type]
    data = world.admin.token.encode_abi("mint", [world.stranger.address, 1])
    with pytest.raises(ContractRevert) as exc:
        sender.send(world.admin.token.address, data, gas=200_000)
    assert exc.value.error_name == "AccessControlUnauthorizedAccount"


def test_concurrent_senders_do_not_collide_on_nonces(world: World) -> None:
    """Eight threads share one key (and one more client each): every transfer lands exactly once."""
    recipients = [Wallet.create().address for _ in range(8)]
    clients = [world.stranger.with_wallet(world.stranger.wallet) for _ in recipients]  # type: ignore[arg-type]
    errors: list[BaseException] = []

    def send(i: int) -> None:
        try:
            for _ in range(3):
                clients[i].transfer(recipients[i], ONE_TOKEN)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(recipients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert [world.admin.balance_of(r) for r in recipients] == [3 * ONE_TOKEN] * len(recipients)


def test_event_reader_order_and_confirmations(world: World) -> None:
    start = world.admin.block_number() + 1
    world.onboard(world.provider, world.node)
    world.onboard(world.provider2, world.node2, nonce=2)
    world.provider.submit_work(world.pool_id, world.node.address, key(1), 1)
    world.provider2.submit_work(world.pool_id, world.node2.address, key(2), 2)
    world.validator.invalidate_work(world.pool_id, key(1))
    head = world.admin.block_number()

    reader = EventReader(world.admin, confirmations=0, pool_id=world.pool_id, start_block=start)
    events = reader.poll()
    kinds = [e.kind for e in events]
    assert kinds == [
        "NodeJoined",
        "NodeJoined",
        "WorkSubmitted",
        "WorkSubmitted",
        "NodeEjected",
        "WorkInvalidated",
    ]
    assert [(e.block_number, e.log_index) for e in events] == sorted(
        (e.block_number, e.log_index) for e in events
    )
    assert isinstance(events[0], NodeJoinedEvent) and events[0].node == world.node.address
    sub = events[2]
    assert isinstance(sub, WorkSubmittedEvent) and sub.work_key == "0x" + key(1).hex() and sub.units == 1
    assert isinstance(events[4], NodeEjectedEvent) and events[4].by == world.validator.address
    inv = events[5]
    assert isinstance(inv, WorkInvalidatedEvent) and inv.slashed == 200 * ONE_TOKEN
    assert reader.cursor == head + 1 and reader.poll() == []

    # With 2 confirmations the last two blocks (invalidation, second submission) are not yet safe.
    deep = EventReader(world.admin, confirmations=2, pool_id=world.pool_id, start_block=start)
    first = deep.poll()
    assert [e.kind for e in first] == ["NodeJoined", "NodeJoined", "WorkSubmitted"]
    assert deep.cursor == head - 1
    world.chain.mine(2)
    assert [e.kind for e in deep.poll()] == ["WorkSubmitted", "NodeEjected", "WorkInvalidated"]

    only_work = EventReader(world.admin, kinds=("WorkSubmitted",), start_block=start)
    assert [e.kind for e in only_work.poll()] == ["WorkSubmitted", "WorkSubmitted"]
    other_pool = EventReader(world.admin, pool_id=world.pool_id + 100, start_block=start)
    assert other_pool.poll() == []
    small_ranges = EventReader(world.admin, pool_id=world.pool_id, start_block=start, max_range=1)
    assert [e.kind for e in small_ranges.poll()] == kinds


def test_artifacts_match_sources() -> None:
    """Recompile with the pinned solcjs; committed ABI/bytecode must be exactly what the sources give."""
    proc = subprocess.run(
        ["node", str(PROJECT_ROOT / "contracts" / "compile.js"), "--check"],
        capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "artifacts match sources" in proc.stdout


def test_receipt_wait_times_out_cleanly(world: World) -> None:
    """With mining paused the transaction is accepted but never mined: a LedgerTimeout, not a hang."""
    from ledger.errors import LedgerTimeout

    slow = LedgerClient(world.chain.rpc_url, world.deployment, world.stranger.wallet, timeout=1, check=False)
    world.chain.rpc("evm_setAutomine", [False])
    try:
        with pytest.raises(LedgerTimeout, match="no receipt"):
            slow.transfer(world.admin.address, 1)
    finally:
        world.chain.rpc("anvil_dropAllTransactions")
        world.chain.rpc("evm_setAutomine", [True])
    slow.transfer(world.admin.address, 1)  # the nonce was not burnt: the next send goes through


def test_a_transaction_replaced_by_another_sender_of_the_key_is_sent_again(world: World) -> None:
    """Another process with the same key replaces our pending transaction (same nonce, higher fees):
    ours is never mined. The sender sees its nonce used by another transaction and sends its own
    again with the next nonce, instead of waiting out its receipt timeout (CI saw that race)."""
    from ledger.errors import LedgerTimeout

    sender = world.stranger.with_wallet(world.stranger.wallet)
    w3, address = sender.w3, sender.wallet.account.address
    ours, theirs = Wallet.create().address, Wallet.create().address
    outcome: dict[str, object] = {}

    def send() -> None:
        try:
            outcome["result"] = sender.transfer(ours, 5)
        except (LedgerTimeout, ContractRevert) as exc:
            outcome["error"] = exc

    world.chain.rpc("evm_setAutomine", [False])
    thread = threading.Thread(target=send)
    try:
        thread.start()
        nonce = w3.eth.get_transaction_count(address, "latest")
        deadline = time.monotonic() + 10
        while w3.eth.get_transaction_count(address, "pending") == nonce:  # ours is in the pool
            assert time.monotonic() < deadline, "our transfer never reached the pool"
            time.sleep(0.02)
        base = int(w3.eth.get_block("latest").get("baseFeePerGas") or 0)
        tip = 10 * max(int(w3.eth.max_priority_fee), 10**9)
        replacement = sender.wallet.account.sign_transaction({
            "to": sender.token.address, "data": sender.token.encode_abi("transfer", [theirs, 7]),
            "value": 0, "gas": 100_000, "chainId": w3.eth.chain_id, "type": 2, "nonce": nonce,
            "maxPriorityFeePerGas": tip, "maxFeePerGas": 4 * base + tip,
        })  # fmt: skip
        w3.eth.send_raw_transaction(replacement.raw_transaction)
        world.chain.rpc("evm_mine", [])
    finally:
        world.chain.rpc("evm_setAutomine", [True])
    deadline = time.monotonic() + 15
    while thread.is_alive() and time.monotonic() < deadline:
        world.chain.rpc("evm_mine", [])  # a resend that reached the pool before automine came back
        thread.join(0.2)
    assert not thread.is_alive() and "error" not in outcome, outcome
    assert (world.admin.balance_of(theirs), world.admin.balance_of(ours)) == (7, 5)
    assert w3.eth.get_transaction_count(address, "latest") == nonce + 2


SENDER_SCRIPT = """
import sys
from intellect.identity import Wallet
from ledger.client import LedgerClient
from ledger.deploy import Deployment
client = LedgerClient(sys.argv[1], Deployment.load(sys.argv[2]), Wallet.from_key(sys.argv[3]), check=False)
for _ in range(int(sys.argv[5])):
    client.transfer(sys.argv[4], 1)
"""


def test_concurrent_processes_sharing_a_key(world: World, tmp_path) -> None:
    """Three processes with one key race on the pending nonce; retries make every transfer land."""
    deployment = world.deployment.save(tmp_path / "d.json")
    key = world.chain.dev_keys[5]  # the stranger's key
    targets = [Wallet.create().address for _ in range(3)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SENDER_SCRIPT, world.chain.rpc_url, str(deployment), key, t, "8"],
            cwd=PROJECT_ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for t in targets
    ]
    for p in procs:
        _, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
    assert [world.admin.balance_of(t) for t in targets] == [8, 8, 8]


def test_revert_message_names_the_missing_role(world: World) -> None:
    with pytest.raises(ContractRevert, match="neededRole=VALIDATOR_ROLE"):
        world.stranger.invalidate_work(world.pool_id, b"\x01" * 32)


def test_a_receipt_served_after_the_nonce_moved_is_not_sent_again(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A node may show the sender's nonce used before it serves the receipt of the transaction that
    used it (anvil did on a busy machine). That transaction was mined: sending it again would run it
    twice (seen: a submission sent again reverted WorkAlreadySubmitted). Here the node serves each
    receipt only on the fourth ask; the transfer is made once and its receipt returned."""
    sender = world.stranger.with_wallet(world.stranger.wallet)
    eth = sender.w3.eth
    real = eth.get_transaction_receipt
    asked: dict[bytes, int] = {}

    def late_receipt(tx_hash: Any) -> Any:
        key = bytes(tx_hash)
        asked[key] = asked.get(key, 0) + 1
        if asked[key] < 4:
            raise TransactionNotFound(f"not yet: ask {asked[key]}")
        return real(tx_hash)

    monkeypatch.setattr(eth, "get_transaction_receipt", late_receipt)
    to = Wallet.create().address
    receipt = sender.transfer(to, 5)
    assert receipt.status == 1 and world.admin.balance_of(to) == 5
    assert list(asked.values()) == [4]  # one transaction, asked for until served
