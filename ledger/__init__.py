"""Python side of the on-chain ledger: local chain, deployment, typed client, events, pool owner's CLI.

Import what you need from the submodules, e.g. `from ledger.client import LedgerClient`.
"""

from ledger.errors import ContractRevert, LedgerError

__all__ = ["ContractRevert", "LedgerError"]
