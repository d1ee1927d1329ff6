"""Helpers for worker tests: a devnet description and a uvicorn server in a thread."""

# ruff: noqa: E402
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

# pytest puts tests/ on sys.path (tests/shared is a package), where tests/worker would shadow the real
# `worker` package as a namespace package; the project root must come first.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from intellect.identity import Wallet
from ledger.client import LedgerClient
from ledger.dev.anvil import Anvil
from ledger.models import ONE_TOKEN
from tests.support.testing import ServerThread  # noqa: F401  (re-exported for conftest)

POOL_DATA = '{"requirements": {"cpu_cores": 1}}'


@dataclass
class Devnet:
    anvil: Anvil
    deployment_path: Path
    admin: LedgerClient
    manager: Wallet
    validator: Wallet
    pool_id: int
    domain_id: int
    provider_keys: list[str]

    @property
    def rpc_url(self) -> str:
        return self.anvil.rpc_url

    def client(self, wallet: Wallet | None = None) -> LedgerClient:
        return LedgerClient(self.rpc_url, self.deployment_path, wallet)

    def fresh_provider(self, tokens: int = 1000) -> Wallet:
        """A new key with gas money and `tokens` tokens, so tests never share a provider."""
        wallet = Wallet.create()
        self.anvil.rpc("anvil_setBalance", [wallet.address, hex(10**20)])
        if tokens:
            self.admin.mint(wallet.address, tokens * ONE_TOKEN)
        return wallet


