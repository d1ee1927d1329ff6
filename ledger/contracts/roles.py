"""Access-control roles. Most grants span two contracts (a validator invalidates work on the pool
contract and validates nodes on the registry; a federator keeps the registry's lists and the
domains), so they live here rather than in any one contract's wrapper."""

from __future__ import annotations

from eth_utils import to_checksum_address
from web3.contract import Contract

from ledger.contracts.base import ContractBase
from ledger.deploy import role
from ledger.models import TxResult

VALIDATOR_ROLE = role("VALIDATOR_ROLE")
FEDERATOR_ROLE = role("FEDERATOR_ROLE")
MINTER_ROLE = role("MINTER_ROLE")
POOL_ROLE = role("POOL_ROLE")
DEFAULT_ADMIN_ROLE = b"\x00" * 32


def _role_id(role_name: str) -> bytes:
    return DEFAULT_ADMIN_ROLE if role_name == "DEFAULT_ADMIN_ROLE" else role(role_name)


class RolesContract(ContractBase):
    def _on_each(self, fn: str, role_id: bytes, address: str, *contracts: Contract) -> list[TxResult]:
        """`fn` (grantRole/revokeRole) for one role on several contracts, one transaction each, in order."""
        a = to_checksum_address(address)
        return [self._tx(contract, fn, role_id, a) for contract in contracts]

    def grant_validator(self, address: str) -> list[TxResult]:
        """VALIDATOR_ROLE on the pool contract (invalidate work) and the registry (validate nodes)."""
        return self._on_each("grantRole", VALIDATOR_ROLE, address, self.pools, self.registry)

    def revoke_validator(self, address: str) -> list[TxResult]:
        return self._on_each("revokeRole", VALIDATOR_ROLE, address, self.pools, self.registry)

    def is_validator(self, address: str) -> bool:
        return bool(self._call(self.pools, "hasRole", VALIDATOR_ROLE, to_checksum_address(address)))

    def grant_federator(self, address: str) -> list[TxResult]:
        """FEDERATOR_ROLE on the registry (white/blacklists) and the domain registry (domains)."""
        return self._on_each("grantRole", FEDERATOR_ROLE, address, self.registry, self.domains)

    def is_federator(self, address: str) -> bool:
        return bool(self._call(self.registry, "hasRole", FEDERATOR_ROLE, to_checksum_address(address)))

    def grant_minter(self, address: str) -> TxResult:
        return self._tx(self.token, "grantRole", MINTER_ROLE, to_checksum_address(address))

    def grant_role(self, contract: str, role_name: str, address: str) -> TxResult:
        """Generic grant, e.g. grant_role("ComputeRegistry", "POOL_ROLE", addr)."""
        r = _role_id(role_name)
        return self._tx(self.contracts[contract], "grantRole", r, to_checksum_address(address))

    def has_role(self, contract: str, role_name: str, address: str) -> bool:
        r = _role_id(role_name)
        return bool(self._call(self.contracts[contract], "hasRole", r, to_checksum_address(address)))
