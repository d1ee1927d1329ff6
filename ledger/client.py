"""Typed client for the Intellect contracts. Every view returns a model from `ledger.models`;
every state change returns a `TxResult` (or the id it created) and raises `ContractRevert` with the
contract's custom error name when it would revert.

`LedgerClient` is only the composition: the calls to each contract live in its own wrapper under
`ledger/contracts/`, all over one `ContractBase` (connection, wallet, sender), so every caller keeps
one object and one import while each file stays about one contract."""

from __future__ import annotations

from intellect.identity import Wallet
from ledger.contracts.domains import DomainsContract
from ledger.contracts.pools import PoolsContract
from ledger.contracts.providers import ProvidersContract
from ledger.contracts.roles import (
    DEFAULT_ADMIN_ROLE,
    FEDERATOR_ROLE,
    MINTER_ROLE,
    POOL_ROLE,
    VALIDATOR_ROLE,
    RolesContract,
)
from ledger.contracts.work import WorkContract

__all__ = [
    "DEFAULT_ADMIN_ROLE",
    "FEDERATOR_ROLE",
    "MINTER_ROLE",
    "POOL_ROLE",
    "VALIDATOR_ROLE",
    "LedgerClient",
]


class LedgerClient(ProvidersContract, DomainsContract, PoolsContract, WorkContract, RolesContract):
    """One deployment on one chain, optionally with a wallet for transactions. The token's calls
    come in through `ProvidersContract`, which builds on `TokenContract` to approve stake."""

    def with_wallet(self, wallet: Wallet) -> LedgerClient:
        """Same deployment and chain, another signer (no re-check)."""
        return LedgerClient(self.rpc_url, self.deployment, wallet, timeout=self.timeout, check=False)
