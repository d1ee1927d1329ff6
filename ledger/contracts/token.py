"""`IntellectToken`: balances, allowances, mint and transfers, plus the chain's native balance.

Approving the registry to take stake lives here too: it is a token call whose spender happens to
be the registry, and the provider wrapper builds on it (see `providers.py`)."""

from __future__ import annotations

from eth_utils import to_checksum_address

from ledger.contracts.base import ContractBase
from ledger.models import TxResult


class TokenContract(ContractBase):
    def balance_of(self, address: str) -> int:
        return int(self._call(self.token, "balanceOf", to_checksum_address(address)))

    def allowance(self, owner: str, spender: str) -> int:
        return int(
            self._call(self.token, "allowance", to_checksum_address(owner), to_checksum_address(spender))
        )

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
