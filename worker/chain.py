"""Everything the worker does on chain, through the ledger client: register, join, leave, claim.

The provider key sends the transactions (it holds the stake and the gas); the node key only signs
(its ownership proof for `addNode`). Registration steps are idempotent: each first reads the chain,
so a worker that crashed halfway resumes without paying twice.

`Chain` is what the daemon, the API and the CLI need of the ledger; `WorkerChain` implements it over
`LedgerClient` (a test can hand the daemon anything with the same methods).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, cast

from eth_utils import to_checksum_address

from intellect.wire.invites import InviteRequest
from intellect.wire.requirements import PoolRequirements, parse_pool_requirements
from ledger.client import LedgerClient
from ledger.deploy import Deployment
from ledger.errors import ContractRevert, LedgerError
from ledger.invites import Invite
from ledger.models import ONE_TOKEN, Node, Pool, Provider, TxResult, Unbond
from worker.api import Role
from worker.keys import WorkerKeys
from worker.uploader import LedgerWork

__all__ = [
    "Chain",
    "ChainAuthorizer",
    "ClaimResult",
    "ContractRevert",
    "LedgerError",
    "Membership",
    "NothingToClaim",
    "RegistrationDeclined",
    "WorkerChain",
]

T = TypeVar("T")


class RegistrationDeclined(Exception):
    """The user said no to spending stake, or the provider cannot afford it (message says what to do)."""


class NothingToClaim(LedgerError):
    """No matured rewards and no released unbonding: the message says when something will be."""


def tokens(amount: int) -> str:
    return f"{amount / ONE_TOKEN:,.4f}".rstrip("0").rstrip(".")


def when(timestamp: int) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True)
class RegistrationPlan:
    """What `ensure_registered` is about to spend, for the confirmation prompt."""

    register_stake: int  # 0 = already registered
    extra_stake: int  # top-up needed to cover the new node's compute units
    add_node: bool

    @property
    def spend(self) -> int:
        return self.register_stake + self.extra_stake


@dataclass(frozen=True)
class Membership:
    """Where the node stands, read in one place so `status` and the daemon never contradict each other.

    `reason` is None while the node may work in the pool; otherwise why not and what to do."""

    pool_id: int
    node_registered: bool
    in_pool: bool
    active_pool: int  # the registry's view: 0 = in no pool
    provider_registered: bool
    provider_blacklisted: bool
    node_blacklisted_in_pool: bool
    provider_blacklisted_in_pool: bool

    @property
    def reason(self) -> str | None:
        if self.provider_blacklisted:
            return "the provider is blacklisted in the registry: this node cannot work anywhere"
        if self.provider_blacklisted_in_pool:
            return f"the provider is blacklisted in pool {self.pool_id}: pick another pool (--pool-id)"
        if self.node_blacklisted_in_pool:
            return f"the node is blacklisted in pool {self.pool_id}: pick another pool (--pool-id)"
        if not self.node_registered:
            return ("the node is not registered on chain (deregistered): run `intellect-worker start` "
                    "to register it again")
        if not self.in_pool:
            return f"the node is not in pool {self.pool_id} (left or ejected): it waits for a new invite"
        return None


@dataclass(frozen=True)
class ClaimResult:
    kind: Literal["rewards", "stake"]
    amount: int
    tx_hash: str
    gas_used: int


@dataclass
class ClaimPreview:
    """What `claim` would collect now, and what matures later."""

    rewards_claimable: int
    rewards_pending: int
    stake_releasable: int
    unbonding: list[Unbond] = field(default_factory=list)  # still locked, with release times
    chain_time: int = 0


class Chain(Protocol):
    """The ledger as the worker sees it: its own provider and node, one pool at a time."""

    @property
    def provider(self) -> str: ...
    @property
    def node(self) -> str: ...

    def get_pool(self, pool_id: int) -> Pool: ...
    def requirements(self, pool_id: int) -> PoolRequirements: ...
    def get_provider(self) -> Provider: ...
    def get_node(self) -> Node | None: ...
    def in_pool(self, pool_id: int) -> bool: ...
    def membership(self, pool_id: int) -> Membership: ...
    def is_validator(self, address: str) -> bool: ...
    def join(self, request: InviteRequest) -> str: ...
    def work(self, pool_id: int) -> LedgerWork: ...


class WorkerChain:
    def __init__(self, rpc_url: str, deployment_path: Path, keys: WorkerKeys) -> None:
        deployment = Deployment.load(deployment_path)
        self.keys = keys
        self.provider_client = LedgerClient(rpc_url, deployment, keys.provider)

    @property
    def provider(self) -> str:
        return self.keys.provider.address

    @property
    def node(self) -> str:
        return self.keys.node.address

    # ---- reads ----

    def get_pool(self, pool_id: int) -> Pool:
        return self.provider_client.get_pool(pool_id)

    def requirements(self, pool_id: int) -> PoolRequirements:
        return parse_pool_requirements(self.get_pool(pool_id).data_uri)

    def get_provider(self) -> Provider:
        return self.provider_client.get_provider(self.provider)

    def get_node(self) -> Node | None:
        return self.provider_client.get_node(self.node)

    def in_pool(self, pool_id: int) -> bool:
        return self.provider_client.is_node_in_pool(pool_id, self.node)

    def balances(self) -> dict[str, dict[str, int]]:
        c = self.provider_client
        out = {}
        for label, address in (("provider", self.provider), ("node", self.node)):
            out[label] = {"eth_wei": c.eth_balance(address), "tokens": c.balance_of(address)}
        return out

    def is_validator(self, address: str) -> bool:
        return self.provider_client.is_validator(address)

    def membership(self, pool_id: int) -> Membership:
        c = self.provider_client
        node = self.get_node()
        provider = self.get_provider()
        return Membership(
            pool_id=pool_id,
            node_registered=node is not None,
            in_pool=c.is_node_in_pool(pool_id, self.node),
            active_pool=node.active_pool if node else 0,
            provider_registered=provider.registered,
            provider_blacklisted=provider.blacklisted,
            node_blacklisted_in_pool=c.is_node_blacklisted(pool_id, self.node),
            provider_blacklisted_in_pool=c.is_provider_blacklisted_in_pool(pool_id, self.provider),
        )

    def work(self, pool_id: int) -> LedgerWork:
        """Work submission for the uploader, sent with the provider key."""
        return LedgerWork(self.provider_client, pool_id, self.node)

    # ---- stake and rewards ----

    def unbonds(self) -> list[Unbond]:
        return self.provider_client.unbonds(self.provider)

    def preview_claim(self) -> ClaimPreview:
        c = self.provider_client
        now = c.timestamp()
        unbonds = self.unbonds()
        return ClaimPreview(
            rewards_claimable=c.claimable_rewards(self.node),
            rewards_pending=c.pending_rewards(self.node),
            stake_releasable=sum(u.amount for u in unbonds if u.release_at <= now),
            unbonding=sorted((u for u in unbonds if u.release_at > now), key=lambda u: u.release_at),
            chain_time=now,
        )

    def claim(self) -> list[ClaimResult]:
        """Claim matured rewards (minted to the provider) and released stake; NothingToClaim otherwise."""
        preview = self.preview_claim()
        c = self.provider_client
        results = []
        if preview.rewards_claimable:
            tx = c.claim_rewards(self.node)
            results.append(ClaimResult("rewards", _amount(tx, "RewardsClaimed", preview.rewards_claimable),
                                       tx.tx_hash, tx.gas_used))
        if preview.stake_releasable:
            tx = c.claim_unbonded()
            results.append(ClaimResult("stake", _amount(tx, "UnbondedClaimed", preview.stake_releasable),
                                       tx.tx_hash, tx.gas_used))
        if results:
            return results
        later = []
        if preview.rewards_pending:
            later.append(f"{tokens(preview.rewards_pending)} tokens of rewards are still locked")
        if preview.unbonding:
            first = preview.unbonding[0]
            later.append(f"{tokens(first.amount)} tokens of stake unbond at {when(first.release_at)} "
                         f"(chain time now {when(preview.chain_time)})")
        raise NothingToClaim(
            f"nothing to claim yet for provider {self.provider} (node {self.node})"
            + (": " + "; ".join(later) if later else ": no rewards and no unbonding stake"))

    # ---- registration ----

    def plan(self, compute_units: int, stake: int | None) -> RegistrationPlan:
        provider = self.get_provider()
        node = self.get_node()
        if node is not None:
            if to_checksum_address(node.provider) != self.provider:
                raise LedgerError(f"node {self.node} is registered under another provider ({node.provider})")
            return RegistrationPlan(0, 0, False)
        # required = (provider's units + new units + 1) x stake minimum, as the registry computes it
        needed = self.provider_client.required_stake(self.provider, compute_units)
        if not provider.registered:
            chosen = needed if stake is None else stake
            if chosen < needed:
                raise RegistrationDeclined(
                    f"stake {tokens(chosen)} is below the {tokens(needed)} tokens required for "
                    f"{compute_units} compute unit(s); raise --stake")
            return RegistrationPlan(chosen, 0, True)
        return RegistrationPlan(0, max(0, needed - provider.stake), True)

    def ensure_registered(
        self, compute_units: int, stake: int | None, confirm: Callable[[RegistrationPlan], bool]
    ) -> list[str]:
        """Register the provider and add the node as needed; returns the transaction hashes."""
        plan = self.plan(compute_units, stake)
        txs: list[str] = []
        if plan.spend:
            balance = self.provider_client.balance_of(self.provider)
            if balance < plan.spend:
                raise RegistrationDeclined(
                    f"provider {self.provider} holds {tokens(balance)} tokens but needs {tokens(plan.spend)} "
                    f"to stake: fund it first (on a devnet: `intellect devnet fund {self.provider}`)")
            if not confirm(plan):
                raise RegistrationDeclined(
                    "stake not approved: nothing was spent (pass --yes to skip the prompt)")
            c = self.provider_client
            steps = ((plan.register_stake, c.register_provider), (plan.extra_stake, c.increase_stake))
            for amount, send in steps:
                if amount:
                    approved = c.approve_stake(amount)  # its own tx, so the count the user reads is right
                    txs += [approved.tx_hash] if approved else []
                    txs.append(send(amount).tx_hash)
        if plan.add_node:
            txs.append(self.provider_client.add_node(self.keys.node, compute_units).tx_hash)
        return txs

    # ---- pool membership ----

    def join(self, request: InviteRequest) -> str:
        invite = Invite(domain_id=request.domain_id, pool_id=request.pool_id, node=request.node_address,
                        nonce=int(request.nonce, 16), expiration=request.expiration,
                        signature=request.signature)
        return self.provider_client.join_pool(request.pool_id, self.node, invite).tx_hash

    def leave(self, pool_id: int) -> str | None:
        if not self.in_pool(pool_id):
            return None
        return self.provider_client.leave_pool(pool_id, self.node).tx_hash

    def deregister(self, pool_id: int | None) -> list[str]:
        """Leave the pool, remove the node, and start unbonding the whole stake if no node remains."""
        txs = []
        if pool_id is not None:
            tx = self.leave(pool_id)
            if tx:
                txs.append(tx)
        if self.get_node() is not None:
            txs.append(self.provider_client.remove_node(self.node).tx_hash)
        provider = self.get_provider()
        if provider.registered and provider.node_count == 0:
            txs.append(self.provider_client.deregister_provider().tx_hash)
        return txs


class ChainAuthorizer:
    """Who may call the worker API: the pool's manager (read on chain) or a validator (role on chain).

    Answers are cached briefly so a burst of requests costs one RPC call, while a manager key
    rotation or a revoked role takes effect within `ttl` seconds.
    """

    def __init__(self, chain: Chain, pool_id: int, ttl: float = 15.0) -> None:
        self.chain = chain
        self.pool_id = pool_id
        self.ttl = ttl
        self._cache: dict[str, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def _cached(self, key: str, compute: Callable[[], T]) -> T:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            if hit and hit[0] > now:
                return cast(T, hit[1])
        value = compute()
        with self._lock:
            self._cache[key] = (now + self.ttl, value)
        return value

    def role_of(self, address: str) -> Role | None:
        address = to_checksum_address(address)
        manager = self._cached(
            "manager", lambda: to_checksum_address(self.chain.get_pool(self.pool_id).manager))
        if address == manager:
            return "manager"
        if self._cached(f"validator:{address}", lambda: self.chain.is_validator(address)):
            return "validator"
        return None


def _amount(tx: TxResult, event: str, fallback: int) -> int:
    found = tx.event(event)
    value = found.args.get("amount") if found is not None else None
    return int(value) if isinstance(value, int) else fallback
