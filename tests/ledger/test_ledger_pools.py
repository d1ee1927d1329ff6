"""DomainRegistry and ComputePool membership: create, start, end, invites, leave, eject, blacklists."""

from __future__ import annotations

import pytest
from ledger_world import World, reverts

from intellect.identity import Wallet
from ledger.client import LedgerClient
from ledger.errors import LedgerError
from ledger.invites import sign_invite
from ledger.models import ONE_TOKEN, PoolStatus


def test_domains(world: World) -> None:
    d = world.admin.get_domain(world.domain_id)
    assert (d.name, d.parameters_uri, d.creator) == ("math", "file:///domains/math.json", world.admin.address)
    with reverts("AccessControlUnauthorizedAccount"):
        world.stranger.create_domain("code")
    with reverts("EmptyDomainName"):
        world.admin.create_domain("")
    with reverts("DomainNotFound"):
        world.admin.get_domain(99)
    world.admin.update_domain_parameters(world.domain_id, "file:///v2.json")
    assert world.admin.get_domain(world.domain_id).parameters_uri == "file:///v2.json"
    with reverts("AccessControlUnauthorizedAccount"):
        world.stranger.update_domain_parameters(world.domain_id, "x")


def test_pool_lifecycle_and_creator_checks(world: World) -> None:
    c = world.stranger  # anyone may create a pool and owns it
    with reverts("DomainNotFound"):
        c.create_pool(42, world.manager.address, "p")
    with reverts("EmptyPoolName"):
        c.create_pool(world.domain_id, world.manager.address, "")
    pool_id = c.create_pool(world.domain_id, world.manager.address, "p2", "file:///req.json", 50)
    pool = c.get_pool(pool_id)
    assert pool.status is PoolStatus.PENDING and pool.creator == c.address and pool.compute_limit == 50
    steps = [(LedgerClient.start_pool, PoolStatus.ACTIVE, "PoolNotPending"),
             (LedgerClient.end_pool, PoolStatus.COMPLETED, "PoolAlreadyEnded")]  # fmt: skip
    for step, status, twice in steps:
        with reverts("NotPoolCreator"):  # only the pool's creator may start or end it
            step(world.admin, pool_id)
        step(c, pool_id)
        assert c.get_pool(pool_id).status is status
        with reverts(twice):
            step(c, pool_id)
    with reverts("PoolNotFound"):
        c.get_pool(999)


def test_join_with_invite_and_leave(world: World) -> None:
    world.onboard(world.provider, world.node, units=10)
    assert world.admin.pool_nodes(world.pool_id) == [world.node.address]
    assert world.admin.is_node_in_pool(world.pool_id, world.node.address)
    assert world.admin.get_node(world.node.address).active_pool == world.pool_id  # type: ignore[union-attr]
    assert world.admin.get_pool(world.pool_id).total_compute_units == 10
    with reverts("NotNodeOperator"):
        world.stranger.leave_pool(world.pool_id, world.node.address)
    world.node_client(world.node).leave_pool(world.pool_id, world.node.address)  # the node key may act too
    assert world.admin.pool_nodes(world.pool_id) == []
    assert world.admin.get_pool(world.pool_id).total_compute_units == 0
    with reverts("NodeNotInPool"):
        world.provider.leave_pool(world.pool_id, world.node.address)


def test_join_before_start_reverts(world: World) -> None:
    pool_id = world.admin.create_pool(world.domain_id, world.manager.address, "later")
    world.provider.register_provider(1000 * ONE_TOKEN)
    world.provider.add_node(world.node, 1)
    with reverts("PoolNotActive"):
        world.provider.join_pool(
            pool_id, world.node.address, world.invite(world.node.address, pool_id=pool_id)
        )


def test_expired_invite_reverts(world: World) -> None:
    world.provider.register_provider(1000 * ONE_TOKEN)
    world.provider.add_node(world.node, 1)
    invite = world.invite(world.node.address, ttl=60)
    world.chain.increase_time(120)
    with reverts("InviteExpired"):
        world.provider.join_pool(world.pool_id, world.node.address, invite)


def test_reused_invite_reverts(world: World) -> None:
    world.provider.register_provider(1000 * ONE_TOKEN)
    world.provider.add_node(world.node, 1)
    invite = world.invite(world.node.address, nonce=7)
    world.provider.join_pool(world.pool_id, world.node.address, invite)
    assert world.admin.invite_used(invite)
    world.provider.leave_pool(world.pool_id, world.node.address)
    with reverts("InviteAlreadyUsed"):
        world.provider.join_pool(world.pool_id, world.node.address, invite)
    world.provider.join_pool(world.pool_id, world.node.address, world.invite(world.node.address, nonce=8))


def test_invite_from_wrong_key_or_for_other_node_reverts(world: World) -> None:
    world.provider.register_provider(1000 * ONE_TOKEN)
    world.provider.add_node(world.node, 1)
    forged = sign_invite(Wallet.create(), world.domain_id, world.pool_id, world.node.address, 1, 2**40)
    with reverts("InvalidInviteSignature") as exc:
        world.provider.join_pool(world.pool_id, world.node.address, forged)
    assert exc.value.error_args["manager"] == world.manager.address
    # An invite for node2, replayed for node, recovers to some other address.
    other = world.invite(world.node2.address)
    replay = other.model_copy(update={"node": world.node.address})
    with reverts("InvalidInviteSignature"):
        world.provider.join_pool(world.pool_id, world.node.address, replay)
    with pytest.raises(LedgerError, match="invite is for"):
        world.provider.join_pool(world.pool_id, world.node.address, other)


def test_join_by_stranger_and_unknown_node_revert(world: World) -> None:
    world.provider.register_provider(1000 * ONE_TOKEN)
    world.provider.add_node(world.node, 1)
    with reverts("NotNodeOperator"):
        world.stranger.join_pool(world.pool_id, world.node.address, world.invite(world.node.address))
    with reverts("NodeNotFound"):
        world.provider.join_pool(world.pool_id, world.node2.address, world.invite(world.node2.address))


def test_pool_compute_limit(world: World) -> None:
    pool_id = world.admin.create_pool(world.domain_id, world.manager.address, "small", compute_limit=15)
    world.admin.start_pool(pool_id)
    p = world.provider
    p.register_provider(1000 * ONE_TOKEN)
    p.add_node(world.node, 10)
    p.add_node(world.node2, 6)
    p.join_pool(pool_id, world.node.address, world.invite(world.node.address, pool_id=pool_id))
    with reverts("PoolComputeLimitExceeded") as exc:
        p.join_pool(pool_id, world.node2.address, world.invite(world.node2.address, pool_id=pool_id))
    assert exc.value.error_args == {"poolId": pool_id, "limit": 15, "requested": 16}


def test_node_in_one_pool_at_a_time(world: World) -> None:
    world.onboard(world.provider, world.node)
    pool_id = world.admin.create_pool(world.domain_id, world.manager.address, "second")
    world.admin.start_pool(pool_id)
    with reverts("NodeAlreadyInPool"):
        world.provider.join_pool(
            pool_id, world.node.address, world.invite(world.node.address, pool_id=pool_id)
        )


def test_eject_by_manager_and_creator_only(world: World) -> None:
    world.onboard(world.provider, world.node)
    with reverts("NotPoolManager"):
        world.stranger.eject_node(world.pool_id, world.node.address)
    result = world.admin.with_wallet(world.manager).eject_node(world.pool_id, world.node.address)
    assert result.event("NodeEjected").args["node"] == world.node.address  # type: ignore[union-attr]
    assert not world.admin.is_node_in_pool(world.pool_id, world.node.address)
    with reverts("NodeNotInPool"):
        world.admin.eject_node(world.pool_id, world.node.address)
    # Ejected is not banned: a fresh invite lets it back in.
    world.provider.join_pool(world.pool_id, world.node.address, world.invite(world.node.address, nonce=2))


def test_blacklist_node_and_provider_in_pool(world: World) -> None:
    world.onboard(world.provider, world.node)
    with reverts("NotPoolManager"):
        world.stranger.blacklist_node(world.pool_id, world.node.address)
    world.admin.blacklist_node(world.pool_id, world.node.address)
    assert world.admin.is_node_blacklisted(world.pool_id, world.node.address)
    assert not world.admin.is_node_in_pool(world.pool_id, world.node.address)
    with reverts("NodeBlacklistedInPool"):
        world.provider.join_pool(world.pool_id, world.node.address, world.invite(world.node.address, nonce=2))
    world.onboard(world.provider2, world.node2)
    with reverts("NotPoolManager"):
        world.stranger.blacklist_pool_provider(world.pool_id, world.provider2.address)
    world.admin.blacklist_pool_provider(world.pool_id, world.provider2.address)
    assert world.admin.pool_nodes(world.pool_id) == []
    assert world.admin.is_provider_blacklisted_in_pool(world.pool_id, world.provider2.address)
    with reverts("ProviderBlacklistedInPool"):
        world.provider2.join_pool(
            world.pool_id, world.node2.address, world.invite(world.node2.address, nonce=3)
        )


def test_registry_blacklist_and_whitelist_gate_joins(world: World) -> None:
    world.provider.register_provider(1000 * ONE_TOKEN)
    world.provider.add_node(world.node, 1)
    world.admin.blacklist_provider(world.provider.address)
    with reverts("ProviderIsBlacklisted"):
        world.provider.join_pool(world.pool_id, world.node.address, world.invite(world.node.address))
    world.admin.blacklist_provider(world.provider.address, False)
    with reverts("AccessControlUnauthorizedAccount"):
        world.stranger.set_whitelist_required(True)
    world.admin.set_whitelist_required(True)
    with reverts("ProviderNotWhitelisted"):
        world.provider.join_pool(world.pool_id, world.node.address, world.invite(world.node.address))
    world.admin.whitelist_provider(world.provider.address)
    world.provider.join_pool(world.pool_id, world.node.address, world.invite(world.node.address))


def test_end_pool_releases_nodes_and_blocks_joins(world: World) -> None:
    world.onboard(world.provider, world.node)
    world.admin.end_pool(world.pool_id)
    assert world.admin.pool_nodes(world.pool_id) == []
    assert world.admin.get_node(world.node.address).active_pool == 0  # type: ignore[union-attr]
    with reverts("PoolNotActive"):
        world.provider.join_pool(world.pool_id, world.node.address, world.invite(world.node.address, nonce=2))
