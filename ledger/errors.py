"""Ledger exceptions. Reverts carry the Solidity custom error's name and decoded arguments."""

from __future__ import annotations

from typing import Any

from eth_utils import keccak

# Role ids as they appear in AccessControlUnauthorizedAccount, shown by name so the fix is obvious.
ROLE_NAMES = {"0x" + "00" * 32: "DEFAULT_ADMIN_ROLE"} | {
    "0x" + keccak(text=r).hex(): r for r in ("MINTER_ROLE", "FEDERATOR_ROLE", "VALIDATOR_ROLE", "POOL_ROLE")
}


class LedgerError(Exception):
    """Any failure talking to the ledger, with a message that names what went wrong."""


class LedgerConfigError(LedgerError):
    """Wrong chain, no code at a deployed address, missing deployment file or key."""


class InsufficientFunds(LedgerError):
    """The sender cannot pay the gas (or value) of a transaction; the message names the address."""


class LedgerTimeout(LedgerError):
    """A transaction was sent but no receipt arrived in time."""


class ContractRevert(LedgerError):
    """A call or transaction reverted; `error_name` is the custom error (e.g. `InviteExpired`)."""

    def __init__(self, error_name: str, args: dict[str, Any] | None = None, raw: str | None = None):
        self.error_name = error_name
        self.args_dict: dict[str, Any] = dict(args or {})
        self.raw = raw
        shown = ", ".join(f"{k}={_show(v)}" for k, v in self.args_dict.items())
        super().__init__(f"{error_name}({shown})")

    @property
    def error_args(self) -> dict[str, Any]:
        return self.args_dict


def _show(value: Any) -> str:
    if isinstance(value, bytes):
        value = "0x" + value.hex()
    return ROLE_NAMES.get(str(value), str(value))
