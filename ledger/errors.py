"""Ledger exceptions. Reverts carry the Solidity custom error's name and decoded arguments."""

from __future__ import annotations

from typing import Any


class LedgerError(Exception):
    """Any failure talking to the ledger, with a message that names what went wrong."""


class LedgerConfigError(LedgerError):
    """Wrong chain, no code at a deployed address, missing deployment file or key."""


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
        return "0x" + value.hex()
    return str(value)
