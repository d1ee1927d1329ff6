"""Slashing by quorum on a real chain: a pool names its validators and a k-of-n policy; the k-th
`voteInvalidate` slashes the amount, ejects the node and drops its locked rewards in one transaction,
later votes are no-ops; soft invalidation takes one vote and the owner can pardon it; every misuse
reverts with a named error."""

from __future__ import annotations

import hashlib

import pytest
from ledger_world import World, reverts

from intellect.identity import Wallet
from ledger.errors import LedgerError
from ledger.models import ONE_TOKEN, WorkStatus

DAY = 24 * 3600
SLASH = 50 * ONE_TOKEN


def key(i: int) -> bytes:
    return hashlib.sha256(f"quorum-file-{i}".encode()).digest()


def three_validators(world: World):  # noqa: ANN201
    extra = world.admin.with_wallet(Wallet.from_key(world.chain.dev_keys[7]))
    validators = [world.validator, world.stranger, extra]
    owner = world.admin.with_wallet(world.manager)
    for v in validators:
        owner.slashing.add_validator(world.pool_id, v.address)
    return owner, validators


def test_two_of_three_quorum_slashes_once(world: World) -> None:
    owner, (v1, v2, v3) = three_validators(world)
    owner.slashing.set_policy(world.pool_id, 2, SLASH, DAY)
    policy = world.admin.slashing.policy(world.pool_id)
    assert (policy.quorum, policy.slash_amount, policy.window_seconds) == (2, SLASH, DAY)
    assert set(world.admin.slashing.validators(world.pool_id)) == {v1.address, v2.address, v3.address}
    world.onboard(world.provider, world.node, stake=1000 * ONE_TOKEN)
    world.provider.submit_work(world.pool_id, world.node.address, key(1), 5)
    stake = world.admin.get_provider(world.provider.address).stake

    first = v1.slashing.vote_invalidate(world.pool_id, key(1))
    assert first.event("InvalidationVoted").args["votes"] == 1  # type: ignore[union-attr]
    assert first.event("WorkInvalidated") is None
    assert world.admin.get_work(world.pool_id, key(1)).status is WorkStatus.SUBMITTED  # type: ignore[union-attr]
    with reverts("AlreadyVoted"):
        v1.slashing.vote_invalidate(world.pool_id, key(1))

    second = v2.slashing.vote_invalidate(world.pool_id, key(1))
    ev = second.event("WorkInvalidated")
    assert ev is not None and ev.args["slashed"] == SLASH and ev.args["rewardsDropped"] == 5 * ONE_TOKEN
    assert world.admin.get_provider(world.provider.address).stake == stake - SLASH
    assert not world.admin.is_node_in_pool(world.pool_id, world.node.address)
    assert world.admin.pending_rewards(world.node.address) == 0
    print("final vote gas", second.gas_used)
    assert second.gas_used <= 200_000

    third = v3.slashing.vote_invalidate(world.pool_id, key(1))  # decided: a no-op, not a revert
    assert third.event("InvalidationVoted") is None and third.event("WorkInvalidated") is None
    assert world.admin.get_provider(world.provider.address).stake == stake - SLASH
    assert world.admin.slashing.votes(world.pool_id, key(1), v3.address).votes == 2


def test_a_validator_removed_and_added_again_still_votes_once_per_work(world: World) -> None:
    """Votes live in one tally slot per work, one bit per validator seat: a seat is never reused."""
    owner, (v1, v2, v3) = three_validators(world)
    owner.slashing.set_policy(world.pool_id, 2, SLASH, DAY)
    world.onboard(world.provider, world.node)
    world.provider.submit_work(world.pool_id, world.node.address, key(7), 1)
    v1.slashing.vote_soft_invalidate(world.pool_id, key(7))
    assert [world.admin.slashing.votes(world.pool_id, key(7), v.address).voted for v in (v1, v2, v3)] == [
        True, False, False
    ]  # fmt: skip
    owner.slashing.remove_validator(world.pool_id, v1.address)
    owner.slashing.add_validator(world.pool_id, v1.address)
    with reverts("AlreadyVoted"):
        v1.slashing.vote_invalidate(world.pool_id, key(7))
    ev = v2.slashing.vote_invalidate(world.pool_id, key(7)).event("InvalidationVoted")
    assert ev is not None and ev.args["votes"] == 1  # hard votes; the soft one counts toward the quorum
    assert work_status(world, key(7)) is WorkStatus.SOFT_INVALIDATED  # 1 soft + 1 hard: rejected, no slash
    assert world.admin.slashing.votes(world.pool_id, key(7), v3.address).voted is False


def work_status(world: World, k: bytes) -> WorkStatus:
    rec = world.admin.get_work(world.pool_id, k)
    assert rec is not None
    return rec.status


def test_named_errors(world: World) -> None:
    owner, (v1, v2, _v3) = three_validators(world)
    with reverts("NotPoolManager"):
        world.stranger.slashing.set_policy(world.pool_id, 1, SLASH, DAY)
    with reverts("InvalidQuorum"):
        owner.slashing.set_policy(world.pool_id, 4, SLASH, DAY)
    with reverts("InvalidWindow"):
        owner.slashing.set_policy(world.pool_id, 2, SLASH, 0)
    owner.slashing.set_policy(world.pool_id, 3, SLASH, DAY)
    with reverts("InvalidQuorum"):  # removing one would leave 2 validators for a quorum of 3
        owner.slashing.remove_validator(world.pool_id, v2.address)
    world.onboard(world.provider, world.node)
    world.provider.submit_work(world.pool_id, world.node.address, key(2), 1)
    outsider = world.admin.with_wallet(Wallet.from_key(world.chain.dev_keys[8]))
    with reverts("NotPoolValidator"):
        outsider.slashing.vote_invalidate(world.pool_id, key(2))
    with reverts("WorkNotFound"):
        v1.slashing.vote_invalidate(world.pool_id, key(99))
    world.chain.increase_time(DAY + 1)
    with reverts("VoteWindowClosed"):
        v1.slashing.vote_invalidate(world.pool_id, key(2))
    with pytest.raises(LedgerError, match="not hex"):
        v1.slashing.vote_invalidate(world.pool_id, "0xnothex")


def test_without_a_policy_one_global_validator_decides(world: World) -> None:
    world.onboard(world.provider, world.node)
    world.provider.submit_work(world.pool_id, world.node.address, key(3), 2)
    with reverts("NotPoolValidator"):  # no policy: only the global validator role may vote
        world.stranger.slashing.vote_invalidate(world.pool_id, key(3))
    result = world.validator.slashing.vote_invalidate(world.pool_id, key(3))
    assert result.event("WorkInvalidated") is not None
    assert world.admin.get_work(world.pool_id, key(3)).status is WorkStatus.INVALIDATED  # type: ignore[union-attr]


def quorum_of_two_with_work(world: World, work_key: bytes, units: int):  # noqa: ANN201
    """Three pool validators, a 2-of-3 policy, the node in the pool with `work_key` submitted; returns the
    owner, the validators and the provider's stake before any vote."""
    owner, validators = three_validators(world)
    owner.slashing.set_policy(world.pool_id, 2, SLASH, DAY)
    world.onboard(world.provider, world.node)
    world.provider.submit_work(world.pool_id, world.node.address, work_key, units)
    return owner, validators, world.admin.get_provider(world.provider.address).stake


def test_soft_invalidation_takes_the_quorum_and_can_be_pardoned(world: World) -> None:
    owner, (v1, v2, v3), stake = quorum_of_two_with_work(world, key(4), 3)
    # one validator that could not judge (cut from storage, behind the trainer) takes no one's pay
    v1.slashing.vote_soft_invalidate(world.pool_id, key(4))
    assert world.admin.get_work(world.pool_id, key(4)).status is WorkStatus.SUBMITTED  # type: ignore[union-attr]
    assert world.admin.pending_rewards(world.node.address) == 3 * ONE_TOKEN
    with reverts("AlreadyVoted"):  # nor does it get a second say, soft or hard
        v1.slashing.vote_invalidate(world.pool_id, key(4))
    v2.slashing.vote_soft_invalidate(world.pool_id, key(4))  # the quorum-th vote decides
    assert world.admin.get_work(world.pool_id, key(4)).status is WorkStatus.SOFT_INVALIDATED  # type: ignore[union-attr]
    v3.slashing.vote_soft_invalidate(world.pool_id, key(4))  # decided already: a no-op
    assert world.admin.pending_rewards(world.node.address) == 0
    assert world.admin.get_provider(world.provider.address).stake == stake  # no slash
    assert world.admin.is_node_in_pool(world.pool_id, world.node.address)
    with reverts("NotPoolManager"):
        world.stranger.slashing.pardon(world.pool_id, key(4))
    owner.slashing.pardon(world.pool_id, key(4))
    assert world.admin.get_work(world.pool_id, key(4)).status is WorkStatus.SUBMITTED  # type: ignore[union-attr]
    assert world.admin.pending_rewards(world.node.address) == 3 * ONE_TOKEN
    with reverts("NotSoftInvalidated"):
        owner.slashing.pardon(world.pool_id, key(4))


def test_a_soft_and_a_hard_vote_make_a_quorum_that_rejects_without_slashing(world: World) -> None:
    owner, (v1, v2, _v3), stake = quorum_of_two_with_work(world, key(5), 2)
    v1.slashing.vote_invalidate(world.pool_id, key(5))
    v2.slashing.vote_soft_invalidate(world.pool_id, key(5))
    # the quorum agrees the work is bad, not that it was cheating: not paid, nobody slashed or ejected
    assert world.admin.get_work(world.pool_id, key(5)).status is WorkStatus.SOFT_INVALIDATED  # type: ignore[union-attr]
    assert world.admin.get_provider(world.provider.address).stake == stake
    assert world.admin.is_node_in_pool(world.pool_id, world.node.address)


def test_slashing_through_the_pool_cli(world: World, tmp_path) -> None:  # noqa: ANN001
    import json

    from typer.testing import CliRunner

    from ledger.cli import app

    deployment = world.deployment.save(tmp_path / "deployment.json")
    runner = CliRunner()
    keys = world.chain.dev_keys

    def run(key: str, *args: str, expect: int = 0) -> str:
        env = {"INTELLECT_RPC_URL": world.chain.rpc_url, "INTELLECT_PRIVATE_KEY": key,
               "INTELLECT_HOME": str(tmp_path / "home")}  # fmt: skip
        result = runner.invoke(app, ["slashing", *args, "--deployment", str(deployment)], env=env)
        assert result.exit_code == expect, result.output
        return result.output

    manager_key = "0x" + world.manager.private_key_hex().removeprefix("0x")
    v1, v2 = world.validator, world.stranger
    for v in (v1, v2):
        run(manager_key, "validators", "add", str(world.pool_id), v.address)
    out = run(manager_key, "policy", "set", str(world.pool_id), "--quorum", "3", "--amount", "10", expect=1)
    assert "InvalidQuorum" in out and out.count("\n") == 1  # one unwrapped line
    assert "tx 0x" in run(manager_key, "policy", "set", str(world.pool_id), "--quorum", "2", "--amount", "10")
    shown = json.loads(run(manager_key, "policy", "show", str(world.pool_id), "--json"))
    assert (shown["quorum"], shown["slash_amount"]) == (2, 10 * ONE_TOKEN)
    assert set(json.loads(run(manager_key, "validators", "list", str(world.pool_id), "--json"))) == {
        v1.address,
        v2.address,
    }
    world.onboard(world.provider, world.node)
    world.provider.submit_work(world.pool_id, world.node.address, key(5), 1)
    work = "0x" + key(5).hex()
    v1_key = [k for k in keys if Wallet.from_key(k).address == v1.address][0]
    v2_key = [k for k in keys if Wallet.from_key(k).address == v2.address][0]
    assert "vote 1 counted" in run(v1_key, "vote", str(world.pool_id), work)
    assert "decided: WorkInvalidated" in run(v2_key, "vote", str(world.pool_id), work)
    votes = json.loads(run(v1_key, "verdicts", str(world.pool_id), "--json"))
    assert [(r["validator"], r["votes"]) for r in votes if r["work_key"] == work] == [
        (v1.address, 1),
        (v2.address, 2),
    ]
    assert "not hex" in run(v1_key, "vote", str(world.pool_id), "0xzz", expect=1)


def test_no_reward_unlocks_before_its_work_can_no_longer_be_invalidated(world: World) -> None:
    """The lock period can never be shorter than the window in which validators may invalidate: both
    setters refuse it by name, and a reward submitted under a pool whose window outlasts a later,
    shorter lock still stays locked until the pool's window has closed (before this rule, a pool
    locking rewards for 120 s with a 3,600 s window paid for work nobody had judged)."""
    owner, (v1, _, _) = three_validators(world)
    lock = world.admin.work_parameters().reward_lock_period
    with reverts("LockShorterThanWindow"):
        world.admin.set_work_parameters(ONE_TOKEN, 60, 120, SLASH)
    with reverts("LockShorterThanWindow"):
        owner.slashing.set_policy(world.pool_id, 1, SLASH, lock + 1)
    owner.slashing.set_policy(world.pool_id, 1, SLASH, lock)  # as long as the lock: fine
    # the admin later shortens the lock (and the global window): allowed, but this pool's voting
    # window is still `lock`, so its new work stays locked that long
    world.admin.set_work_parameters(ONE_TOKEN, 60, 60, SLASH)
    world.onboard(world.provider, world.node, stake=1000 * ONE_TOKEN)
    world.provider.submit_work(world.pool_id, world.node.address, key(40), 3)
    world.chain.increase_time(61)
    world.chain.mine()
    assert world.admin.claimable_rewards(world.node.address) == 0
    assert world.admin.pending_rewards(world.node.address) == 3 * ONE_TOKEN
    v1.slashing.vote_invalidate(world.pool_id, key(40))  # still inside the window: the vote lands
    assert world.admin.get_work(world.pool_id, key(40)).status is WorkStatus.INVALIDATED  # type: ignore[union-attr]
    assert world.admin.pending_rewards(world.node.address) == 0


def test_a_hardware_slash_takes_the_quorum_and_leaving_does_not_escape_it(world: World) -> None:
    """`voteSlashHardware`: votes on (node, evidence digest) count like work votes; the deciding one
    slashes the policy's amount, drops the locked rewards, blacklists; the node's leaving after the
    first vote changes nothing; a node never in the pool and a voter who is not a validator are refused."""
    from ledger.contracts.slashing import hardware_vote_key

    owner, (v1, v2, v3) = three_validators(world)
    owner.slashing.set_policy(world.pool_id, 2, SLASH, DAY)
    world.onboard(world.provider, world.node, stake=1000 * ONE_TOKEN)
    world.provider.submit_work(world.pool_id, world.node.address, key(40), 3)
    stake = world.admin.get_provider(world.provider.address).stake
    evidence = hashlib.sha256(b"a wrong answer the node signed").digest()
    node = world.node.address

    first = v1.slashing.vote_slash_hardware(world.pool_id, node, evidence)
    assert first.event("HardwareSlashVoted").args["votes"] == 1  # type: ignore[union-attr]
    assert first.event("NodeSlashedForHardware") is None
    assert world.admin.slashing.votes(world.pool_id, hardware_vote_key(node, evidence), v1.address).voted
    with reverts("AlreadyVoted"):
        v1.slashing.vote_slash_hardware(world.pool_id, node, evidence)
    with reverts("NotPoolValidator"):
        world.provider.slashing.vote_slash_hardware(world.pool_id, node, evidence)
    world.provider.leave_pool(world.pool_id, node)  # too late: the first vote was cast in the pool

    second = v2.slashing.vote_slash_hardware(world.pool_id, node, evidence)
    ev = second.event("NodeSlashedForHardware")
    assert ev is not None and ev.args["slashed"] == SLASH and ev.args["dropped"] == 3 * ONE_TOKEN
    assert ev.args["evidence"] == "0x" + evidence.hex()
    assert world.admin.get_provider(world.provider.address).stake == stake - SLASH
    assert world.admin.is_node_blacklisted(world.pool_id, node)
    assert world.admin.pending_rewards(node) == 0
    late = v3.slashing.vote_slash_hardware(world.pool_id, node, evidence)  # decided: a no-op
    assert late.event("HardwareSlashVoted") is None and late.event("NodeSlashedForHardware") is None
    assert world.admin.get_provider(world.provider.address).stake == stake - SLASH
    with reverts("NodeNotInPool"):  # other evidence against a node that is not in the pool
        v1.slashing.vote_slash_hardware(world.pool_id, node, hashlib.sha256(b"other").digest())
