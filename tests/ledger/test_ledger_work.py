"""Work submissions, invalidation (slash, eject, drop rewards), stable listing, rewards."""

from __future__ import annotations

import hashlib

from ledger_world import World, reverts

from ledger.models import ONE_TOKEN, WorkStatus

DAY = 24 * 3600
PENALTY = 200 * ONE_TOKEN


def key(i: int) -> bytes:
    return hashlib.sha256(f"file-{i}".encode()).digest()


def test_submit_work_records_and_emits(world: World) -> None:
    world.onboard(world.provider, world.node)
    result = world.node_client(world.node).submit_work(world.pool_id, world.node.address, key(1), 5)
    ev = result.event("WorkSubmitted")
    assert ev is not None
    assert ev.args["poolId"] == world.pool_id and ev.args["workKey"] == "0x" + key(1).hex()
    assert (ev.args["provider"], ev.args["node"], ev.args["units"]) == (
        world.provider.address, world.node.address, 5
    )  # fmt: skip
    rec = world.admin.get_work(world.pool_id, key(1))
    assert rec is not None and rec.status is WorkStatus.SUBMITTED and rec.units == 5
    assert rec.reward == 5 * ONE_TOKEN and rec.timestamp == ev.args["timestamp"]
    assert world.admin.get_work(world.pool_id, key(2)) is None
    assert world.admin.pending_rewards(world.node.address) == 5 * ONE_TOKEN


def test_submit_work_errors(world: World) -> None:
    world.onboard(world.provider, world.node)
    world.provider.submit_work(world.pool_id, world.node.address, key(1), 1)
    with reverts("WorkAlreadySubmitted"):
        world.provider.submit_work(world.pool_id, world.node.address, key(1), 1)
    with reverts("ZeroWorkUnits"):
        world.provider.submit_work(world.pool_id, world.node.address, key(2), 0)
    with reverts("NotNodeOperator"):
        world.stranger.submit_work(world.pool_id, world.node.address, key(3), 1)
    world.provider2.register_provider(1000 * ONE_TOKEN)
    world.provider2.add_node(world.node2, 1)
    with reverts("NodeNotInPool"):
        world.provider2.submit_work(world.pool_id, world.node2.address, key(4), 1)
    world.admin.end_pool(world.pool_id)
    with reverts("PoolNotActive"):
        world.provider.submit_work(world.pool_id, world.node.address, key(5), 1)


def test_invalidate_slashes_ejects_and_drops_locked_rewards(world: World) -> None:
    world.onboard(world.provider, world.node, stake=1000 * ONE_TOKEN)
    world.onboard(world.provider2, world.node2, nonce=2)
    world.provider.submit_work(world.pool_id, world.node.address, key(1), 3)
    world.provider.submit_work(world.pool_id, world.node.address, key(2), 4)
    world.provider2.submit_work(world.pool_id, world.node2.address, key(3), 6)
    with reverts("AccessControlUnauthorizedAccount"):
        world.stranger.invalidate_work(world.pool_id, key(1))
    result = world.validator.invalidate_work(world.pool_id, key(1))
    ev = result.event("WorkInvalidated")
    assert ev is not None and ev.args["slashed"] == PENALTY and ev.args["rewardsDropped"] == 7 * ONE_TOKEN
    assert world.admin.get_provider(world.provider.address).stake == 1000 * ONE_TOKEN - PENALTY
    assert not world.admin.is_node_in_pool(world.pool_id, world.node.address)
    assert world.admin.pending_rewards(world.node.address) == 0
    assert world.admin.get_work(world.pool_id, key(1)).status is WorkStatus.INVALIDATED  # type: ignore[union-attr]
    # The honest node is untouched.
    assert world.admin.pending_rewards(world.node2.address) == 6 * ONE_TOKEN
    with reverts("WorkAlreadyInvalidated"):
        world.validator.invalidate_work(world.pool_id, key(1))
    with reverts("WorkNotFound"):
        world.validator.invalidate_work(world.pool_id, key(9))
    # The cheater is blacklisted in the pool: even a fresh invite cannot bring it back.
    assert world.admin.is_node_blacklisted(world.pool_id, world.node.address)
    assert result.event("NodeBlacklisted") is not None
    with reverts("NodeBlacklistedInPool"):
        world.provider.join_pool(world.pool_id, world.node.address, world.invite(world.node.address, nonce=5))
    # An invalidated key stays refused, whoever submits it.
    with reverts("WorkKeyInvalidated"):
        world.provider2.submit_work(world.pool_id, world.node2.address, key(1), 3)


def test_invalidation_after_window_reverts(world: World) -> None:
    world.onboard(world.provider, world.node)
    world.provider.submit_work(world.pool_id, world.node.address, key(1), 1)
    world.chain.increase_time(DAY + 1)
    with reverts("InvalidationWindowPassed"):
        world.validator.invalidate_work(world.pool_id, key(1))
    with reverts("InvalidationWindowPassed"):
        world.validator.soft_invalidate_work(world.pool_id, key(1))


def test_slash_is_capped_at_what_the_provider_has(world: World) -> None:
    world.onboard(world.provider, world.node, units=1, stake=50 * ONE_TOKEN)
    world.provider.submit_work(world.pool_id, world.node.address, key(1), 1)
    ev = world.validator.invalidate_work(world.pool_id, key(1)).event("WorkInvalidated")
    assert ev is not None and ev.args["slashed"] == 50 * ONE_TOKEN
    assert world.admin.get_provider(world.provider.address).stake == 0


def test_soft_invalidation_drops_only_the_work(world: World) -> None:
    world.onboard(world.provider, world.node)
    world.provider.submit_work(world.pool_id, world.node.address, key(1), 2)
    world.provider.submit_work(world.pool_id, world.node.address, key(2), 3)
    with reverts("AccessControlUnauthorizedAccount"):
        world.stranger.soft_invalidate_work(world.pool_id, key(1))
    stake = world.admin.get_provider(world.provider.address).stake
    world.validator.soft_invalidate_work(world.pool_id, key(1))
    assert world.admin.get_provider(world.provider.address).stake == stake
    assert world.admin.is_node_in_pool(world.pool_id, world.node.address)
    assert world.admin.pending_rewards(world.node.address) == 3 * ONE_TOKEN
    assert [w.work_key for w in world.admin.work_since(world.pool_id)] == ["0x" + key(2).hex()]
    with reverts("WorkKeyInvalidated"):
        world.provider.submit_work(world.pool_id, world.node.address, key(1), 2)


def test_work_since_is_stable_across_invalidations_and_pages(world: World) -> None:
    world.onboard(world.provider, world.node)
    world.onboard(world.provider2, world.node2, nonce=2)
    stamps = []
    for i in range(12):
        client, node = (world.provider, world.node) if i % 2 else (world.provider2, world.node2)
        if i == 6:
            world.chain.increase_time(100)
        stamps.append(
            client.submit_work(world.pool_id, node.address, key(i), 1)
            .event("WorkSubmitted")
            .args["timestamp"]
        )  # type: ignore[union-attr]  # noqa: E501
    # Remove entries in the middle; the reference's swap-and-pop reordered what remained.
    for i in (2, 4, 10):
        world.validator.soft_invalidate_work(world.pool_id, key(i))
    expected = ["0x" + key(i).hex() for i in range(12) if i not in (2, 4, 10)]
    assert [w.work_key for w in world.admin.work_since(world.pool_id, 0)] == expected
    assert [w.work_key for w in world.admin.work_since(world.pool_id, 0, page_size=2)] == expected
    since = stamps[6]
    later = [w.work_key for w in world.admin.work_since(world.pool_id, since, page_size=3)]
    assert later == ["0x" + key(i).hex() for i in range(6, 12) if i != 10]
    assert world.admin.work_since(world.pool_id, stamps[-1] + 1) == []
    assert world.admin.work_count(world.pool_id) == 12


def test_rewards_locked_then_claimable(world: World) -> None:
    world.onboard(world.provider, world.node)
    world.provider.submit_work(world.pool_id, world.node.address, key(1), 4)
    assert world.admin.claimable_rewards(world.node.address) == 0
    with reverts("NothingToClaim"):
        world.provider.claim_rewards(world.node.address)
    with reverts("NotNodeOperator"):
        world.stranger.claim_rewards(world.node.address)
    world.chain.increase_time(DAY + 1)
    assert world.admin.pending_rewards(world.node.address) == 0
    assert world.admin.claimable_rewards(world.node.address) == 4 * ONE_TOKEN
    before = world.admin.balance_of(world.provider.address)
    world.node_client(world.node).claim_rewards(world.node.address)  # paid to the provider
    assert world.admin.balance_of(world.provider.address) == before + 4 * ONE_TOKEN
    assert world.admin.claimable_rewards(world.node.address) == 0
    # Matured rewards survive a later invalidation; only locked ones are dropped.
    world.provider.submit_work(world.pool_id, world.node.address, key(2), 1)
    world.chain.increase_time(DAY + 1)
    world.provider.submit_work(world.pool_id, world.node.address, key(3), 2)
    ev = world.validator.invalidate_work(world.pool_id, key(3)).event("WorkInvalidated")
    assert ev is not None and ev.args["rewardsDropped"] == 2 * ONE_TOKEN
    assert world.admin.claimable_rewards(world.node.address) == ONE_TOKEN


def test_work_parameters_admin_only(world: World) -> None:
    with reverts("AccessControlUnauthorizedAccount"):
        world.stranger.set_work_parameters(1, 1, 1, 1)
    world.admin.set_work_parameters(2 * ONE_TOKEN, 120, 60, 5 * ONE_TOKEN)
    p = world.admin.work_parameters()
    assert (p.reward_per_unit, p.reward_lock_period, p.invalidation_window, p.slash_penalty) == (
        2 * ONE_TOKEN, 120, 60, 5 * ONE_TOKEN
    )  # fmt: skip
