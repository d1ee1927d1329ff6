"""`ComputeRegistry`: providers and their stake, unbonding, nodes, white/blacklists, the treasury
and direct slashes.

Registering and adding stake first approve the registry on the token, so this wrapper derives
from `TokenContract` rather than from the bare base."""

from __future__ import annotations

from eth_utils import to_checksum_address

from intellect.identity import Wallet
from ledger.contracts.base import struct
from ledger.contracts.token import TokenContract
from ledger.errors import LedgerError
from ledger.invites import sign_node_ownership
from ledger.models import Node, Provider, TxResult, Unbond

# The structs getProvider and getNode return (Provider and Node put the address asked about first).
_PROVIDER = "registered whitelisted blacklisted stake total_compute_units node_count registered_at"
_NODE = "provider compute_units validated active_pool added_at"


class ProvidersContract(TokenContract):
    # ---- providers ----

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
        return Provider(address=to_checksum_address(address), **struct(_PROVIDER, t))

    def provider_nodes(self, address: str) -> list[str]:
        return list(self._call(self.registry, "getProviderNodes", to_checksum_address(address)))

    def unbonds(self, address: str) -> list[Unbond]:
        return [
            Unbond(amount=a, release_at=r)
            for a, r in self._call(self.registry, "getUnbonds", to_checksum_address(address))
        ]

    def required_stake(self, provider: str, new_units: int = 0) -> int:
        return int(self._call(self.registry, "requiredStake", to_checksum_address(provider), new_units))

    def slashable_balance(self, provider: str) -> int:
        return int(self._call(self.registry, "slashableBalance", to_checksum_address(provider)))

    def whitelist_provider(self, provider: str, status: bool = True) -> TxResult:
        return self._tx(self.registry, "setProviderWhitelisted", to_checksum_address(provider), status)

    def blacklist_provider(self, provider: str, status: bool = True) -> TxResult:
        return self._tx(self.registry, "setProviderBlacklisted", to_checksum_address(provider), status)

    def stake_minimum(self) -> int:
        return int(self._call(self.registry, "stakeMinimum"))

    def set_stake_minimum(self, value: int) -> TxResult:
        return self._tx(self.registry, "setStakeMinimum", value)

    def unbonding_period(self) -> int:
        return int(self._call(self.registry, "unbondingPeriod"))

    def set_unbonding_period(self, seconds: int) -> TxResult:
        return self._tx(self.registry, "setUnbondingPeriod", seconds)

    def set_treasury(self, address: str) -> TxResult:
        return self._tx(self.registry, "setTreasury", to_checksum_address(address))

    def treasury(self) -> str:
        return str(self._call(self.registry, "treasury"))

    def slash(self, provider: str, amount: int) -> TxResult:
        """Direct slash (POOL_ROLE only; validators slash through `invalidate_work`)."""
        return self._tx(self.registry, "slash", to_checksum_address(provider), amount)

    # ---- nodes ----

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
        return Node(address=node, **struct(_NODE, self._call(self.registry, "getNode", node)))

    def validate_node(self, node: str, status: bool = True) -> TxResult:
        return self._tx(self.registry, "setNodeValidated", to_checksum_address(node), status)
