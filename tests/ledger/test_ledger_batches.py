"""Batched work submission on a real chain: one `submitWorkBatch` records many files under a standard
Merkle root; each file is then a work record of its own (read, voted, slashed, soft-invalidated and
pardoned by its key, exactly as a single submission), and no key is ever counted twice, whether in two
batches, twice in one, or once alone and once in a batch."""

from __future__ import annotations

import hashlib

import pytest
from ledger_world import World, reverts

from ledger.audit import Auditor
from ledger.client import LedgerClient
from ledger.errors import ContractRevert
from ledger.events import EventReader, WorkSubmittedEvent
from ledger.merkle import BatchTree
from ledger.models import ONE_TOKEN, WorkRecord, WorkStatus

DAY = 24 * 3600
SLASH = 50 * ONE_TOKEN


def key(i: int) -> bytes:
    return hashlib.sha256(f"batch-file-{i}".encode()).digest()


def work(world: World, k: bytes) -> WorkRecord:
    rec = world.admin.get_work(world.pool_id, k)
    assert rec is not None, f"{k.hex()} is not on chain"
    return rec


def two_of_two(world: World) -> tuple[LedgerClient, LedgerClient, LedgerClient]:
    """The pool's owner and two pool validators under a 2-of-2 slashing policy."""
    owner = world.admin.with_wallet(world.manager)
    v1, v2 = world.validator, world.stranger
    for v in (v1, v2):
        owner.slashing.add_validator(world.pool_id, v.address)
    owner.slashing.set_policy(world.pool_id, 2, SLASH, DAY)
    return owner, v1, v2


def files(lo: int, hi: int) -> list[tuple[bytes, int]]:
    return [(key(i), i % 4 + 1) for i in range(lo, hi)]


def test_a_batch_records_every_file_with_its_units_and_the_root(world: World) -> None:
    world.onboard(world.provider, world.node)
    batch = files(0, 9)
    result = world.provider.submit_work_batch(world.pool_id, world.node.address, batch)
    ev = result.event("WorkBatchSubmitted")
    assert ev is not None and ev.args["batchIndex"] == 0
    tree = BatchTree.of(batch)
    assert ev.args["root"] == "0x" + tree.root.hex()
    assert [bytes(k) for k in ev.args["workKeys"]] == [k for k, _ in batch]
    total = sum(u for _, u in batch)
    assert world.admin.pending_rewards(world.node.address) == total * ONE_TOKEN
    for k, u in batch:
        rec = world.admin.get_work(world.pool_id, k)
        assert rec is not None and rec.status is WorkStatus.SUBMITTED
        assert (rec.units, rec.reward, rec.node, rec.provider) == (
            u, u * ONE_TOKEN, world.node.address, world.provider.address
        )  # fmt: skip
    info = world.admin.get_batch(world.pool_id, 0)
    assert (info.count, info.live_units, info.root) == (9, total, "0x" + tree.root.hex())
    # any holder of a file and its proof can show what the batch claimed for it
    for i, (k, u) in enumerate(batch):
        assert world.admin.verify_batch_leaf(world.pool_id, 0, k, u, tree.proof(i))
        assert not world.admin.verify_batch_leaf(world.pool_id, 0, k, u + 1, tree.proof(i))
    # the watcher reads the batch as its files, in the batch's order
    events = [e for e in EventReader(world.admin, pool_id=world.pool_id, kinds=("WorkSubmitted",))
              .read(result.block_number).events if isinstance(e, WorkSubmittedEvent)]  # fmt: skip
    assert [(e.work_key, e.units, e.leaf, e.batch_index) for e in events] == [
        ("0x" + k.hex(), u, i, 0) for i, (k, u) in enumerate(batch)
    ]


def test_no_file_is_ever_counted_twice(world: World) -> None:
    world.onboard(world.provider, world.node)
    world.provider.submit_work_batch(world.pool_id, world.node.address, files(0, 4))
    world.provider.submit_work(world.pool_id, world.node.address, key(10), 1)
    # a key of an earlier batch, in a new batch (among new keys): the whole batch is refused
    with reverts("WorkAlreadySubmitted"):
        world.provider.submit_work_batch(world.pool_id, world.node.address, [*files(20, 23), (key(2), 3)])
    # a key submitted alone, in a batch
    with reverts("WorkAlreadySubmitted"):
        world.provider.submit_work_batch(world.pool_id, world.node.address, [(key(10), 1)])
    # a batch's key, alone
    with reverts("WorkAlreadySubmitted"):
        world.provider.submit_work(world.pool_id, world.node.address, key(1), 2)
    # the same key twice in one batch (with other units, so the leaves differ)
    with reverts("WorkAlreadySubmitted"):
        world.provider.submit_work_batch(world.pool_id, world.node.address, [(key(30), 1), (key(30), 2)])
    # by another node of another provider: still the same file
    world.onboard(world.provider2, world.node2)
    with reverts("WorkAlreadySubmitted"):
        world.provider2.submit_work_batch(world.pool_id, world.node2.address, [(key(3), 4)])
    assert world.admin.batch_count(world.pool_id) == 1
    assert world.admin.pending_rewards(world.node.address) == (sum(u for _, u in files(0, 4)) + 1) * ONE_TOKEN
    assert world.admin.pending_rewards(world.node2.address) == 0


def test_batch_shape_errors(world: World) -> None:
    world.onboard(world.provider, world.node)
    pools = world.provider.pools
    node = world.node.address
    tree = BatchTree.of(files(0, 3))
    with reverts("BatchRootMismatch"):  # a root over other units
        world.provider._tx(pools, "submitWorkBatch", world.pool_id, node, BatchTree.of(files(0, 2)).root,
                           [k for k, _ in files(0, 3)], [u for _, u in files(0, 3)])  # fmt: skip
    with reverts("BatchSize"):
        world.provider._tx(pools, "submitWorkBatch", world.pool_id, node, tree.root, [], [])
    with reverts("BatchSize"):
        world.provider._tx(pools, "submitWorkBatch", world.pool_id, node, tree.root,
                           [k for k, _ in files(0, 3)], [1, 1])  # fmt: skip
    with reverts("BatchSize"):
        world.provider.submit_work_batch(world.pool_id, node, files(0, 257))
    with reverts("ZeroWorkUnits"):
        world.provider.submit_work_batch(world.pool_id, node, [(key(1), 1), (key(2), 0)])
    with reverts("NotNodeOperator"):
        world.stranger.submit_work_batch(world.pool_id, node, files(0, 2))
    world.admin.end_pool(world.pool_id)
    with reverts("PoolNotActive"):
        world.provider.submit_work_batch(world.pool_id, node, files(0, 2))


def test_one_file_of_a_batch_is_slashed_by_quorum_and_the_rest_pays_nothing(world: World) -> None:
    owner, v1, v2 = two_of_two(world)
    world.onboard(world.provider, world.node, stake=1000 * ONE_TOKEN)
    batch = files(0, 8)
    world.provider.submit_work_batch(world.pool_id, world.node.address, batch)
    stake = world.admin.get_provider(world.provider.address).stake
    assert v1.slashing.vote_invalidate(world.pool_id, key(5)).event("WorkInvalidated") is None
    ev = v2.slashing.vote_invalidate(world.pool_id, key(5)).event("WorkInvalidated")
    assert ev is not None and ev.args["workKey"] == "0x" + key(5).hex() and ev.args["slashed"] == SLASH
    assert ev.args["rewardsDropped"] == sum(u for _, u in batch) * ONE_TOKEN
    assert world.admin.get_provider(world.provider.address).stake == stake - SLASH
    assert not world.admin.is_node_in_pool(world.pool_id, world.node.address)
    assert work(world, key(5)).status is WorkStatus.INVALIDATED
    # its batch mates stay recorded (not invalidated) but carry no reward any more
    mate = work(world, key(4))
    assert mate.status is WorkStatus.SUBMITTED and mate.reward == 0
    world.chain.increase_time(2 * DAY)
    with pytest.raises(ContractRevert, match="NothingToClaim"):
        world.provider.claim_rewards(world.node.address)


def test_soft_invalidating_a_batch_file_takes_its_share_only_and_a_pardon_gives_it_back(world: World) -> None:
    owner, v1, v2 = two_of_two(world)
    world.onboard(world.provider, world.node, stake=1000 * ONE_TOKEN)
    batch = files(0, 6)  # units 1, 2, 3, 4, 1, 2
    world.provider.submit_work_batch(world.pool_id, world.node.address, batch)
    total = sum(u for _, u in batch)
    v1.slashing.vote_soft_invalidate(world.pool_id, key(3))
    ev = v2.slashing.vote_soft_invalidate(world.pool_id, key(3)).event("WorkSoftInvalidated")
    assert ev is not None and ev.args["rewardDropped"] == 4 * ONE_TOKEN
    assert work(world, key(3)).status is WorkStatus.SOFT_INVALIDATED and work(world, key(3)).reward == 0
    assert world.admin.pending_rewards(world.node.address) == (total - 4) * ONE_TOKEN
    assert [work(world, k).reward for k, _ in batch if k != key(3)] == [
        u * ONE_TOKEN for k, u in batch if k != key(3)
    ]
    assert world.admin.get_batch(world.pool_id, 0).live_units == total - 4
    # a second file of the same batch: its own share, computed on what is left
    v1.slashing.vote_soft_invalidate(world.pool_id, key(1))
    v2.slashing.vote_soft_invalidate(world.pool_id, key(1))
    assert world.admin.pending_rewards(world.node.address) == (total - 6) * ONE_TOKEN
    owner.slashing.pardon(world.pool_id, key(3))
    assert work(world, key(3)).status is WorkStatus.SUBMITTED and work(world, key(3)).reward == 4 * ONE_TOKEN
    assert world.admin.pending_rewards(world.node.address) == (total - 2) * ONE_TOKEN
    assert world.admin.get_batch(world.pool_id, 0).live_units == total - 2
    # the node is still in the pool and its stake whole: soft is not a slash
    assert world.admin.is_node_in_pool(world.pool_id, world.node.address)
    # nothing unlocks while the files can still be invalidated; after the lock, exactly what is left
    world.chain.increase_time(DAY - 60)
    assert world.admin.claimable_rewards(world.node.address) == 0
    world.chain.increase_time(120)
    world.chain.mine()
    assert world.admin.claimable_rewards(world.node.address) == (total - 2) * ONE_TOKEN


def test_the_audit_traces_a_payout_to_each_file_of_a_batch(world: World) -> None:
    world.onboard(world.provider, world.node)
    batch = files(0, 5)  # units 1, 2, 3, 4, 1
    result = world.provider.submit_work_batch(world.pool_id, world.node.address, batch)
    world.provider.submit_work(world.pool_id, world.node.address, key(99), 2)
    world.validator.soft_invalidate_work(world.pool_id, key(2))  # 3 units out
    world.chain.increase_time(DAY + 60)
    world.chain.mine()
    claim = world.provider.claim_rewards(world.node.address)
    paid = claim.event("RewardsClaimed")
    assert paid is not None and paid.args["amount"] == (sum(u for _, u in batch) - 3 + 2) * ONE_TOKEN
    audit = Auditor(world.admin).node(world.node.address)
    [payout] = audit.payouts
    assert payout.reconciled and payout.amount == paid.args["amount"]
    assert sorted(w.work_key for w in payout.work) == sorted(
        "0x" + k.hex() for k in [*(k for k, _ in batch if k != key(2)), key(99)]
    )
    by_key = {w.work_key: w for w in [*payout.work, *audit.unpaid]}
    assert by_key["0x" + key(2).hex()].status == "soft_invalidated"
    assert {by_key["0x" + k.hex()].batch_index for k, _ in batch} == {0}
    assert by_key["0x" + key(99).hex()].batch_index is None
    assert all(by_key["0x" + k.hex()].submitted_tx == result.tx_hash for k, _ in batch)
    _, entry = Auditor(world.admin).work_key("0x" + key(3).hex())
    assert entry.status == "paid" and entry.units == 4 and entry.batch_index == 0


def test_listing_and_counting_include_the_files_of_batches(world: World) -> None:
    world.onboard(world.provider, world.node)
    world.provider.submit_work(world.pool_id, world.node.address, key(50), 1)
    world.chain.increase_time(10)  # oldest first is by submission time
    world.provider.submit_work_batch(world.pool_id, world.node.address, files(60, 63))
    world.chain.increase_time(10)
    world.provider.submit_work(world.pool_id, world.node.address, key(51), 1)
    world.validator.soft_invalidate_work(world.pool_id, key(61))  # not accepted: not listed
    assert world.admin.file_count(world.pool_id) == 5 and world.admin.work_count(world.pool_id) == 2
    listed = [w.work_key for w in world.admin.work_since(world.pool_id)]
    assert listed == ["0x" + k.hex() for k in (key(50), key(60), key(62), key(51))]
    later = world.admin.get_work(world.pool_id, key(51))
    assert later is not None
    since = world.admin.work_since(world.pool_id, later.timestamp)
    assert [w.work_key for w in since] == ["0x" + key(51).hex()]
