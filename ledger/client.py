"""Typed client for the Intellect contracts. Every view returns a model from `ledger.models`;
every state change returns a `TxResult` (or the id it created) and raises `ContractRevert` with the
contract's custom error name when it would revert."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eth_utils import to_checksum_address
from web3 import Web3
from web3.contract import Contract

from intellect.identity import Wallet
from ledger.artifacts import abi
from ledger.deploy import DEPLOY_ORDER, Deployment, role
from ledger.errors import LedgerConfigError, LedgerError
from ledger.invites import Invite, sign_node_ownership
from ledger.models import (
    Domain,
    Node,
    Pool,
    PoolStatus,
    Provider,
    TxEvent,
    TxResult,
    Unbond,
    WorkParameters,
    WorkRecord,
    WorkStatus,
)
from ledger.slashing import Slashing, work_key_bytes
from ledger.tx import TxSender, call_view

VALIDATOR_ROLE = role("VALIDATOR_ROLE")
FEDERATOR_ROLE = role("FEDERATOR_ROLE")
MINTER_ROLE = role("MINTER_ROLE")
POOL_ROLE = role("POOL_ROLE")
DEFAULT_ADMIN_ROLE = b"\x00" * 32


def _work(pool_id: int, t: Sequence[Any]) -> WorkRecord:
    return WorkRecord(
        pool_id=pool_id,
        work_key="0x" + bytes(t[0]).hex(),
        provider=t[1],
        node=t[2],
        units=t[3],
        reward=t[4],
        timestamp=t[5],
        status=WorkStatus(t[6]),
    )


class LedgerClient:
    """One deployment on one chain, optionally with a wallet for transactions."""

    def __init__(
        self,
        rpc_url: str,
        deployment: Deployment | str | Path,
        wallet: Wallet | None = None,
        *,
        timeout: float = 60.0,
        check: bool = True,
    ):
        if not isinstance(deployment, Deployment):
            deployment = Deployment.load(deployment)
        self.rpc_url = rpc_url
        self.deployment = deployment
        self.wallet = wallet
        self.timeout = timeout
        self.w3 = Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": timeout}))
        self.contracts: dict[str, Contract] = {
            name: self.w3.eth.contract(address=to_checksum_address(deployment.address(name)), abi=abi(name))
            for name in DEPLOY_ORDER
        }
        self._topic_index: dict[bytes, tuple[str, str]] | None = None
        self._sender: TxSender | None = None
        if check:
            self.check()

    # ---- plumbing ----

    def check(self) -> None:
        """Refuse a chain other than the deployment's, or addresses with no contract code."""
        try:
            chain_id = self.w3.eth.chain_id
        except Exception as exc:
            raise LedgerConfigError(f"cannot reach the chain at {self.rpc_url}: {exc}") from None
        if chain_id != self.deployment.chain_id:
            raise LedgerConfigError(
                f"chain id {chain_id} at {self.rpc_url} does not match the deployment's "
                f"{self.deployment.chain_id}: wrong --rpc-url or --deployment"
            )
        for name, contract in self.contracts.items():
            if len(self.w3.eth.get_code(contract.address)) == 0:
                raise LedgerConfigError(
                    f"no contract code for {name} at {contract.address} on {self.rpc_url}"
                )

    @property
    def token(self) -> Contract:
        return self.contracts["IntellectToken"]

    @property
    def registry(self) -> Contract:
        return self.contracts["ComputeRegistry"]

    @property
    def domains(self) -> Contract:
        return self.contracts["DomainRegistry"]

    @property
    def pools(self) -> Contract:
        return self.contracts["ComputePool"]

    @property
    def address(self) -> str:
        return self._require_wallet().address

    def with_wallet(self, wallet: Wallet) -> LedgerClient:
        """Same deployment and chain, another signer (no re-check)."""
        return LedgerClient(self.rpc_url, self.deployment, wallet, timeout=self.timeout, check=False)

    def _require_wallet(self) -> Wallet:
        if self.wallet is None:
            raise LedgerConfigError(
                "this action sends a transaction: give a key (--keystore or INTELLECT_PRIVATE_KEY)"
            )
        return self.wallet

    def _tx(self, contract: Contract, fn: str, *args: Any, min_gas: int | None = None) -> TxResult:
        if self._sender is None:
            self._sender = TxSender(
                self.w3,
                self._require_wallet(),
                chain_key=f"{self.deployment.chain_id}:{self.rpc_url}",
                timeout=self.timeout,
            )
        receipt = self._sender.send(contract.address, contract.encode_abi(fn, list(args)), min_gas=min_gas)
        return TxResult(
            tx_hash="0x" + bytes(receipt["transactionHash"]).hex(),
            block_number=receipt["blockNumber"],
            gas_used=receipt["gasUsed"],
            status=receipt["status"],
            events=self.decode_logs(receipt["logs"]),
        )

    def _call(self, contract: Contract, fn: str, *args: Any) -> Any:
        return call_view(lambda: contract.functions[fn](*args).call())

    def decode_logs(self, logs: Sequence[Any]) -> list[TxEvent]:
        if self._topic_index is None:
            index: dict[bytes, tuple[str, str]] = {}
            for cname, contract in self.contracts.items():
                for item in contract.abi:
                    if item.get("type") == "event":
                        sig = f"{item['name']}({','.join(i['type'] for i in item['inputs'])})"
                        index[bytes(Web3.keccak(text=sig))] = (cname, item["name"])
            self._topic_index = index
        out = []
        for log in logs:
            if not log["topics"]:
                continue
            hit = self._topic_index.get(bytes(log["topics"][0]))
            if hit is None or to_checksum_address(log["address"]) != self.contracts[hit[0]].address:
                continue
            data = getattr(self.contracts[hit[0]].events, hit[1])().process_log(log)
            out.append(
                TxEvent(
                    name=hit[1],
                    address=data["address"],
                    log_index=data["logIndex"],
                    args={k: _plain(v) for k, v in data["args"].items()},
                )
            )
        return out

    # ---- token ----

    def balance_of(self, address: str) -> int:
        return self._call(self.token, "balanceOf", to_checksum_address(address))

    def allowance(self, owner: str, spender: str) -> int:
        return self._call(self.token, "allowance", to_checksum_address(owner), to_checksum_address(spender))

    def mint(self, to: str, amount: int) -> TxResult:
        return self._tx(self.token, "mint", to_checksum_address(to), amount)

    def approve(self, spender: str, amount: int) -> TxResult:
        return self._tx(self.token, "approve", to_checksum_address(spender), amount)

    def transfer(self, to: str, amount: int) -> TxResult:
        return self._tx(self.token, "transfer", to_checksum_address(to), amount)

    def eth_balance(self, address: str) -> int:
        return self.w3.eth.get_balance(to_checksum_address(address))

    def _ensure_allowance(self, spender: str, amount: int) -> None:
        if self.allowance(self.address, spender) < amount:
            self.approve(spender, amount)

    def approve_stake(self, amount: int) -> TxResult | None:
        """Let the registry take `amount` of stake; the approve sent, or None when already allowed.
        register_provider/increase_stake do this themselves; callers that report every transaction
        they sent call it first."""
        if self.allowance(self.address, self.registry.address) >= amount:
            return None
        return self.approve(self.registry.address, amount)

    # ---- registry: providers ----

    def register_provider(self, stake: int) -> TxResult:
        """Stake `stake` base units and register the wallet as a provider (approves the registry first)."""
        self._ensure_allowance(self.registry.address, stake)
        return self._tx(self.registry, "registerProvider", stake)

    def increase_stake(self, amount: int) -> TxResult:
        self._ensure_allowance(self.registry.address, amount)
        return self._tx(self.registry, "increaseStake", amount)

    def start_unbonding(self, amount: int) -> TxResult:
        return self._tx(self.registry, "startUnbonding", amount)

    def deregister_provider(self) -> TxResult:
        return self._tx(self.registry, "deregisterProvider")

    def claim_unbonded(self) -> TxResult:
        return self._tx(self.registry, "claimUnbonded")

    def get_provider(self, address: str) -> Provider:
        t = self._call(self.registry, "getProvider", to_checksum_address(address))
        return Provider(
            address=to_checksum_address(address),
            registered=t[0],
            whitelisted=t[1],
            blacklisted=t[2],
            stake=t[3],
            total_compute_units=t[4],
            node_count=t[5],
            registered_at=t[6],
        )

    def provider_nodes(self, address: str) -> list[str]:
        return list(self._call(self.registry, "getProviderNodes", to_checksum_address(address)))

    def unbonds(self, address: str) -> list[Unbond]:
        return [
            Unbond(amount=a, release_at=r)
            for a, r in self._call(self.registry, "getUnbonds", to_checksum_address(address))
        ]

    def required_stake(self, provider: str, new_units: int = 0) -> int:
        return self._call(self.registry, "requiredStake", to_checksum_address(provider), new_units)

    def slashable_balance(self, provider: str) -> int:
        return self._call(self.registry, "slashableBalance", to_checksum_address(provider))

    def whitelist_provider(self, provider: str, status: bool = True) -> TxResult:
        return self._tx(self.registry, "setProviderWhitelisted", to_checksum_address(provider), status)

    def blacklist_provider(self, provider: str, status: bool = True) -> TxResult:
        return self._tx(self.registry, "setProviderBlacklisted", to_checksum_address(provider), status)

    def stake_minimum(self) -> int:
        return self._call(self.registry, "stakeMinimum")

    def set_stake_minimum(self, value: int) -> TxResult:
        return self._tx(self.registry, "setStakeMinimum", value)

    def unbonding_period(self) -> int:
        return self._call(self.registry, "unbondingPeriod")

    def set_unbonding_period(self, seconds: int) -> TxResult:
        return self._tx(self.registry, "setUnbondingPeriod", seconds)

    def set_treasury(self, address: str) -> TxResult:
        return self._tx(self.registry, "setTreasury", to_checksum_address(address))

    def treasury(self) -> str:
        return self._call(self.registry, "treasury")

    def slash(self, provider: str, amount: int) -> TxResult:
        """Direct slash (POOL_ROLE only; validators slash through `invalidate_work`)."""
        return self._tx(self.registry, "slash", to_checksum_address(provider), amount)

    # ---- registry: nodes ----

    def add_node(self, node: Wallet | str, compute_units: int, signature: str | None = None) -> TxResult:
        """Add a node under this wallet. Pass the node's Wallet, or its address plus the signature
        it made with `ledger.invites.sign_node_ownership(node_wallet, provider)`."""
        if isinstance(node, Wallet):
            signature = sign_node_ownership(node, self.address)
            node = node.address
        if signature is None:
            raise LedgerError("add_node needs the node's Wallet or its ownership signature")
        return self._tx(
            self.registry,
            "addNode",
            to_checksum_address(node),
            compute_units,
            bytes.fromhex(signature.removeprefix("0x")),
        )

    def remove_node(self, node: str) -> TxResult:
        return self._tx(self.registry, "removeNode", to_checksum_address(node))

    def get_node(self, node: str) -> Node | None:
        node = to_checksum_address(node)
        if not self._call(self.registry, "nodeExists", node):
            return None
        t = self._call(self.registry, "getNode", node)
        return Node(
            address=node, provider=t[0], compute_units=t[1], validated=t[2], active_pool=t[3], added_at=t[4]
        )

    def validate_node(self, node: str, status: bool = True) -> TxResult:
        return self._tx(self.registry, "setNodeValidated", to_checksum_address(node), status)

    # ---- domains ----

    def create_domain(self, name: str, parameters_uri: str = "") -> int:
        result = self._tx(self.domains, "createDomain", name, parameters_uri)
        return int(result.event("DomainCreated").args["domainId"])  # type: ignore[union-attr]

    def get_domain(self, domain_id: int) -> Domain:
        t = self._call(self.domains, "getDomain", domain_id)
        return Domain(id=t[0], name=t[1], parameters_uri=t[2], creator=t[3], created_at=t[4])

    def domain_count(self) -> int:
        return self._call(self.domains, "domainCount")

    def update_domain_parameters(self, domain_id: int, parameters_uri: str) -> TxResult:
        return self._tx(self.domains, "updateParametersURI", domain_id, parameters_uri)

    # ---- pools ----

    def create_pool(
        self, domain_id: int, manager: str, name: str, data_uri: str = "", compute_limit: int = 0
    ) -> int:
        result = self._tx(
            self.pools, "createPool", domain_id, to_checksum_address(manager), name, data_uri, compute_limit
        )
        return int(result.event("PoolCreated").args["poolId"])  # type: ignore[union-attr]

    def start_pool(self, pool_id: int) -> TxResult:
        return self._tx(self.pools, "startPool", pool_id)

    def end_pool(self, pool_id: int) -> TxResult:
        return self._tx(self.pools, "endPool", pool_id)

    def get_pool(self, pool_id: int) -> Pool:
        t = self._call(self.pools, "getPool", pool_id)
        return Pool(
            id=t[0],
            domain_id=t[1],
            creator=t[2],
            manager=t[3],
            name=t[4],
            data_uri=t[5],
            compute_limit=t[6],
            total_compute_units=t[7],
            status=PoolStatus(t[8]),
            created_at=t[9],
            started_at=t[10],
            ended_at=t[11],
        )

    def pool_count(self) -> int:
        return self._call(self.pools, "poolCount")

    def pool_nodes(self, pool_id: int) -> list[str]:
        return list(self._call(self.pools, "getPoolNodes", pool_id))

    def is_node_in_pool(self, pool_id: int, node: str) -> bool:
        return self._call(self.pools, "isNodeInPool", pool_id, to_checksum_address(node))

    def is_node_blacklisted(self, pool_id: int, node: str) -> bool:
        return self._call(self.pools, "nodeBlacklisted", pool_id, to_checksum_address(node))

    def is_provider_blacklisted_in_pool(self, pool_id: int, provider: str) -> bool:
        return self._call(self.pools, "providerBlacklisted", pool_id, to_checksum_address(provider))

    def invite_used(self, invite: Invite) -> bool:
        return self._call(self.pools, "inviteUsed", invite.digest())

    def join_pool(self, pool_id: int, node: str, invite: Invite) -> TxResult:
        """Join with the manager's invite; sent by the node key or its provider."""
        if invite.pool_id != pool_id or invite.node != to_checksum_address(node):
            raise LedgerError(
                f"invite is for pool {invite.pool_id} and node {invite.node}, not {pool_id}/{node}"
            )
        return self._tx(
            self.pools,
            "joinComputePool",
            pool_id,
            to_checksum_address(node),
            invite.nonce,
            invite.expiration,
            bytes.fromhex(invite.signature.removeprefix("0x")),
        )

    def leave_pool(self, pool_id: int, node: str) -> TxResult:
        return self._tx(self.pools, "leaveComputePool", pool_id, to_checksum_address(node))

    def eject_node(self, pool_id: int, node: str) -> TxResult:
        return self._tx(self.pools, "ejectNode", pool_id, to_checksum_address(node))

    def blacklist_node(self, pool_id: int, node: str) -> TxResult:
        return self._tx(self.pools, "blacklistNode", pool_id, to_checksum_address(node))

    def blacklist_pool_provider(self, pool_id: int, provider: str) -> TxResult:
        return self._tx(self.pools, "blacklistProvider", pool_id, to_checksum_address(provider))

    # ---- work ----

    def submit_work(self, pool_id: int, node: str, work_key: bytes | str, units: int) -> TxResult:
        return self._tx(
            self.pools, "submitWork", pool_id, to_checksum_address(node), work_key_bytes(work_key), units
        )

    @property
    def slashing(self) -> Slashing:
        """Quorum slashing: policy, pool validators, votes, pardon (see ledger/slashing.py)."""
        return Slashing(self)

    def invalidate_work(self, pool_id: int, work_key: bytes | str) -> TxResult:
        return self._tx(self.pools, "invalidateWork", pool_id, work_key_bytes(work_key))

    def soft_invalidate_work(self, pool_id: int, work_key: bytes | str) -> TxResult:
        return self._tx(self.pools, "softInvalidateWork", pool_id, work_key_bytes(work_key))

    def get_work(self, pool_id: int, work_key: bytes | str) -> WorkRecord | None:
        key = work_key_bytes(work_key)
        if self.work_count(pool_id) == 0:
            return None
        try:
            return _work(pool_id, self._call(self.pools, "getWork", pool_id, key))
        except LedgerError as exc:
            if getattr(exc, "error_name", "") == "WorkNotFound":
                return None
            raise

    def work_count(self, pool_id: int) -> int:
        return self._call(self.pools, "workCount", pool_id)

    def work_since(self, pool_id: int, since_ts: int = 0, page_size: int = 500) -> list[WorkRecord]:
        """Accepted (not invalidated) work submitted at or after `since_ts`, oldest first."""
        out: list[WorkRecord] = []
        cursor = 0
        total = self.work_count(pool_id)
        while True:
            items, nxt = self._call(self.pools, "getWorkSince", pool_id, since_ts, cursor, page_size)
            out.extend(_work(pool_id, t) for t in items)
            if nxt >= total or nxt == cursor:
                return out
            cursor = nxt

    # ---- rewards ----

    def pending_rewards(self, node: str) -> int:
        """Rewards still inside the lock window (lost if the node's work is invalidated)."""
        return self._call(self.pools, "pendingRewards", to_checksum_address(node))

    def claimable_rewards(self, node: str) -> int:
        return self._call(self.pools, "claimableRewards", to_checksum_address(node))

    def claim_rewards(self, node: str) -> TxResult:
        """Mint the node's matured rewards to its provider."""
        return self._tx(self.pools, "claimRewards", to_checksum_address(node))

    def work_parameters(self) -> WorkParameters:
        return WorkParameters(
            reward_per_unit=self._call(self.pools, "rewardPerUnit"),
            reward_lock_period=self._call(self.pools, "rewardLockPeriod"),
            invalidation_window=self._call(self.pools, "invalidationWindow"),
            slash_penalty=self._call(self.pools, "slashPenalty"),
            whitelist_required=self._call(self.pools, "whitelistRequired"),
        )

    def set_work_parameters(
        self, reward_per_unit: int, reward_lock_period: int, invalidation_window: int, slash_penalty: int
    ) -> TxResult:
        return self._tx(
            self.pools,
            "setParameters",
            reward_per_unit,
            reward_lock_period,
            invalidation_window,
            slash_penalty,
        )

    def set_whitelist_required(self, required: bool) -> TxResult:
        return self._tx(self.pools, "setWhitelistRequired", required)

    # ---- roles ----

    def grant_validator(self, address: str) -> list[TxResult]:
        """VALIDATOR_ROLE on the pool contract (invalidate work) and the registry (validate nodes)."""
        a = to_checksum_address(address)
        return [
            self._tx(self.pools, "grantRole", VALIDATOR_ROLE, a),
            self._tx(self.registry, "grantRole", VALIDATOR_ROLE, a),
        ]

    def revoke_validator(self, address: str) -> list[TxResult]:
        a = to_checksum_address(address)
        return [
            self._tx(self.pools, "revokeRole", VALIDATOR_ROLE, a),
            self._tx(self.registry, "revokeRole", VALIDATOR_ROLE, a),
        ]

    def is_validator(self, address: str) -> bool:
        return self._call(self.pools, "hasRole", VALIDATOR_ROLE, to_checksum_address(address))

    def grant_federator(self, address: str) -> list[TxResult]:
        """FEDERATOR_ROLE on the registry (white/blacklists) and the domain registry (domains)."""
        a = to_checksum_address(address)
        return [
            self._tx(self.registry, "grantRole", FEDERATOR_ROLE, a),
            self._tx(self.domains, "grantRole", FEDERATOR_ROLE, a),
        ]

    def is_federator(self, address: str) -> bool:
        return self._call(self.registry, "hasRole", FEDERATOR_ROLE, to_checksum_address(address))

    def grant_minter(self, address: str) -> TxResult:
        return self._tx(self.token, "grantRole", MINTER_ROLE, to_checksum_address(address))

    def grant_role(self, contract: str, role_name: str, address: str) -> TxResult:
        """Generic grant, e.g. grant_role("ComputeRegistry", "POOL_ROLE", addr)."""
        r = DEFAULT_ADMIN_ROLE if role_name == "DEFAULT_ADMIN_ROLE" else role(role_name)
        return self._tx(self.contracts[contract], "grantRole", r, to_checksum_address(address))

    def has_role(self, contract: str, role_name: str, address: str) -> bool:
        r = DEFAULT_ADMIN_ROLE if role_name == "DEFAULT_ADMIN_ROLE" else role(role_name)
        return self._call(self.contracts[contract], "hasRole", r, to_checksum_address(address))

    # ---- chain ----

    def block_number(self) -> int:
        return self.w3.eth.block_number

    def timestamp(self) -> int:
        return int(self.w3.eth.get_block("latest")["timestamp"])


def _plain(value: Any) -> Any:
    """Event args as JSON-friendly values (bytes -> 0x hex)."""
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    return value
