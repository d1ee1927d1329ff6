"""Ledger settings (env prefix INTELLECT_): chain URL, deployment file, signing key, confirmations."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from intellect.identity import IdentityError, Wallet
from intellect.keyfiles import KeySecret
from intellect.settings import IntellectSettings, default_home
from ledger.errors import LedgerConfigError


class LedgerSettings(IntellectSettings):
    rpc_url: str = "http://127.0.0.1:8545"
    deployment: Path = Field(default_factory=lambda: default_home() / "deployment.json")
    keystore: Path | None = (
        None  # INTELLECT_KEYSTORE; passphrase from INTELLECT_KEYSTORE_PASSPHRASE or a prompt
    )
    private_key: KeySecret | None = None  # INTELLECT_PRIVATE_KEY (raw, or file:PATH)
    confirmations: int = Field(0, ge=0)
    tx_timeout: float = Field(60.0, gt=0)

    def wallet(self) -> Wallet | None:
        """The configured key: a keystore wins over the raw key; None when neither is set."""
        try:
            if self.keystore is not None:
                return Wallet.load(self.keystore)
            if self.private_key is not None:
                return Wallet.from_key(self.private_key.get_secret_value())
        except IdentityError as exc:
            raise LedgerConfigError(str(exc)) from None
        return None

    def require_wallet(self) -> Wallet:
        wallet = self.wallet()
        if wallet is None:
            raise LedgerConfigError("no key: pass --keystore PATH or set INTELLECT_PRIVATE_KEY")
        return wallet
