"""ComputeRegistry: providers, stake, nodes, white/blacklists, unbonding and slashing."""

from __future__ import annotations

from ledger_world import STAKE_MIN, World, reverts

from intellect.identity import Wallet
from ledger.invites import sign_node_ownership
from ledger.models import ONE_TOKEN

DAY = 24 * 3600


def test_register_provider_moves_stake_into_the_registry(world: World) -> None:
    p = world.provider
    before = p.balance_of(p.address)
    p.register_provider(100 * ONE_TOKEN)
    info = p.get_provider(p.address)
    assert info.registered and info.stake == 100 * ONE_TOKEN and info.node_count == 0
    assert p.balance_of(p.address) == before - 100 * ONE_TOKEN
    assert p.balance_of(p.registry.address) == 100 * ONE_TOKEN


def test_register_below_minimum_and_twice_revert(world: World) -> None:
    p = world.provider
    with reverts("InsufficientStake") as exc:
        p.register_provider(STAKE_MIN - 1)
    assert exc.value.error_args == {"required": STAKE_MIN, "available": STAKE_MIN - 1}
    p.register_provider(STAKE_MIN)
    with reverts("ProviderAlreadyRegistered"):
        p.register_provider(STAKE_MIN)


def test_add_node_requires_stake_for_units_plus_one(world: World) -> None:
    p = world.provider
    p.register_provider(50 * ONE_TOKEN)  # covers (0 + 4 + 1) x 10
    with reverts("InsufficientStake") as exc:
        p.add_node(world.node, 5)  # needs (0 + 5 + 1) x 10 = 60
    assert exc.value.error_args["required"] == 60 * ONE_TOKEN
    p.add_node(world.node, 4)
    node = p.get_node(world.node.address)
    assert node is not None and node.provider == p.address and node.compute_units == 4 and not node.validated
    assert p.provider_nodes(p.address) == [world.node.address]
    assert p.required_stake(p.address, 1) == 60 * ONE_TOKEN
    p.increase_stake(10 * ONE_TOKEN)
    p.add_node(world.node2, 1)  # (4 + 1 + 1) x 10 = 60 <= 60
    assert p.get_provider(p.address).total_compute_units == 5


def test_add_node_with_wrong_signature_reverts(world: World) -> None:
    p = world.provider
    p.register_provider(1000 * ONE_TOKEN)
    # Signed for another provider: the digest differs, so the recovered signer is not the node.
    sig = sign_node_ownership(world.node, world.provider2.address)
    with reverts("InvalidNodeSignature") as exc:
        p.add_node(world.node.address, 1, signature=sig)
    assert exc.value.error_args["node"] == world.node.address
    # Signed by a different key over the right digest.
    sig = sign_node_ownership(world.node2, p.address)
    with reverts("InvalidNodeSignature"):
        p.add_node(world.node.address, 1, signature=sig)
    p.add_node(world.node.address, 1, signature=sign_node_ownership(world.node, p.address))


def test_add_node_errors(world: World) -> None:
    p = world.provider
    with reverts("ProviderNotRegistered"):
        p.add_node(world.node, 1)
    p.register_provider(1000 * ONE_TOKEN)
    with reverts("ZeroComputeUnits"):
        p.add_node(world.node, 0)
    p.add_node(world.node, 1)
    with reverts("NodeAlreadyRegistered"):
        p.add_node(world.node, 1)
    world.provider2.register_provider(1000 * ONE_TOKEN)
    with reverts("NodeAlreadyRegistered"):
        world.provider2.add_node(world.node, 1)


def test_remove_node(world: World) -> None:
    world.onboard(world.provider, world.node)
    with reverts("NotNodeProvider"):
        world.stranger.remove_node(world.node.address)
    with reverts("NodeInPool") as exc:
        world.provider.remove_node(world.node.address)
    assert exc.value.error_args["poolId"] == world.pool_id
    world.provider.leave_pool(world.pool_id, world.node.address)
    world.provider.remove_node(world.node.address)
    assert world.provider.get_node(world.node.address) is None
    assert world.provider.get_provider(world.provider.address).total_compute_units == 0
    with reverts("NodeNotFound"):
        world.provider.remove_node(world.node.address)


def test_whitelist_blacklist_and_roles(world: World) -> None:
    addr = world.provider.address
    with reverts("AccessControlUnauthorizedAccount"):
        world.stranger.whitelist_provider(addr)
    with reverts("AccessControlUnauthorizedAccount"):
        world.stranger.blacklist_provider(addr)
    world.admin.whitelist_provider(addr)
    assert world.admin.get_provider(addr).whitelisted
    world.admin.blacklist_provider(addr)
    assert world.admin.get_provider(addr).blacklisted
    with reverts("ProviderIsBlacklisted"):
        world.provider.register_provider(100 * ONE_TOKEN)
    world.admin.blacklist_provider(addr, False)
    world.provider.register_provider(100 * ONE_TOKEN)
    # A federator granted by the admin can manage lists and domains.
    world.admin.grant_federator(world.stranger.address)
    assert world.admin.is_federator(world.stranger.address)
    world.stranger.whitelist_provider(world.provider2.address)
    assert world.stranger.create_domain("code") == world.domain_id + 1


def test_validate_node_by_validator_only(world: World) -> None:
    world.provider.register_provider(1000 * ONE_TOKEN)
    world.provider.add_node(world.node, 1)
    with reverts("AccessControlUnauthorizedAccount"):
        world.stranger.validate_node(world.node.address)
    world.validator.validate_node(world.node.address)
    assert world.admin.get_node(world.node.address).validated  # type: ignore[union-attr]
    with reverts("NodeNotFound"):
        world.validator.validate_node(world.node2.address)


def test_set_stake_minimum_admin_only(world: World) -> None:
    with reverts("AccessControlUnauthorizedAccount"):
        world.stranger.set_stake_minimum(1)
    world.admin.set_stake_minimum(25 * ONE_TOKEN)
    assert world.admin.stake_minimum() == 25 * ONE_TOKEN
    with reverts("InsufficientStake"):
        world.provider.register_provider(20 * ONE_TOKEN)


def test_unbonding_and_deregistration(world: World) -> None:
    p = world.provider
    p.register_provider(200 * ONE_TOKEN)
    p.add_node(world.node, 9)  # requires (9 + 1) x 10 = 100
    with reverts("InsufficientStake") as exc:
        p.start_unbonding(101 * ONE_TOKEN)
    assert exc.value.error_args == {"required": 100 * ONE_TOKEN, "available": 99 * ONE_TOKEN}
    p.start_unbonding(100 * ONE_TOKEN)
    assert p.get_provider(p.address).stake == 100 * ONE_TOKEN
    with reverts("ProviderHasNodes"):
        p.deregister_provider()
    p.remove_node(world.node.address)
    p.deregister_provider()
    info = p.get_provider(p.address)
    assert not info.registered and info.stake == 0
    assert sum(u.amount for u in p.unbonds(p.address)) == 200 * ONE_TOKEN
    with reverts("NothingToClaim"):
        p.claim_unbonded()
    world.chain.increase_time(7 * DAY - 60)
    with reverts("NothingToClaim"):
        p.claim_unbonded()
    before = p.balance_of(p.address)
    world.chain.increase_time(120)
    p.claim_unbonded()
    assert p.balance_of(p.address) == before + 200 * ONE_TOKEN
    assert p.unbonds(p.address) == []
    with reverts("ProviderNotRegistered"):
        p.start_unbonding(1)


def test_slash_takes_unbonding_first_and_never_more_than_staked(world: World) -> None:
    p = world.provider
    p.register_provider(300 * ONE_TOKEN)
    p.start_unbonding(100 * ONE_TOKEN)
    with reverts("AccessControlUnauthorizedAccount"):
        world.admin.slash(p.address, ONE_TOKEN)  # only the pool contract holds POOL_ROLE
    world.admin.grant_role("ComputeRegistry", "POOL_ROLE", world.admin.address)
    with reverts("SlashExceedsStake") as exc:
        world.admin.slash(p.address, 301 * ONE_TOKEN)
    assert exc.value.error_args["available"] == 300 * ONE_TOKEN
    treasury_before = world.admin.balance_of(world.admin.treasury())
    world.admin.slash(p.address, 150 * ONE_TOKEN)
    assert p.unbonds(p.address) == []  # the 100 unbonding went first
    assert p.get_provider(p.address).stake == 150 * ONE_TOKEN
    assert world.admin.balance_of(world.admin.treasury()) == treasury_before + 150 * ONE_TOKEN


def test_unknown_node_is_none_and_new_wallet_unregistered(world: World) -> None:
    assert world.admin.get_node(Wallet.create().address) is None
    assert not world.admin.get_provider(Wallet.create().address).registered
