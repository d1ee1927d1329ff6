"""The provider key (owns the stake) and the node key (signs heartbeats, metadata): load or create.

Raw keys from settings win (devnets); otherwise encrypted keystores `provider.json` / `node.json`
in `<state_dir>/keys`, with the passphrase from `INTELLECT_KEYSTORE_PASSPHRASE` or a prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn

from intellect.identity import IdentityError, Wallet, resolve_passphrase
from worker.settings import WorkerSettings

Role = Literal["provider", "node"]


@dataclass(frozen=True)
class WorkerKeys:
    provider: Wallet
    node: Wallet


def keystore_path(settings: WorkerSettings, role: Role) -> Path:
    return settings.keys_dir / f"{role}.json"


def _env_key(settings: WorkerSettings, role: Role) -> str | None:
    secret = settings.provider_key if role == "provider" else settings.node_key
    return secret.get_secret_value() if secret else None


def load_key(settings: WorkerSettings, role: Role, *, create: bool, passphrase: str | None = None) -> Wallet:
    raw = _env_key(settings, role)
    if raw:
        return Wallet.from_key(raw)
    path = keystore_path(settings, role)
    if path.exists():
        return Wallet.load(path, passphrase if passphrase is not None else resolve_passphrase(
            f"Passphrase for the {role} keystore: "))
    if not create:
        _missing(settings, role)
    wallet = Wallet.create()
    wallet.save(path, passphrase if passphrase is not None else resolve_passphrase(
        f"New passphrase for the {role} keystore: "))
    return wallet


def load_keys(settings: WorkerSettings, *, create: bool) -> WorkerKeys:
    """Both keys; one passphrase prompt serves both keystores."""
    from_store: list[Role] = [r for r in ("provider", "node") if not _env_key(settings, r)]
    if not create:
        for role in from_store:
            if not keystore_path(settings, role).exists():  # fail before asking for a passphrase
                _missing(settings, role)
    need_prompt = bool(from_store)
    passphrase = resolve_passphrase("Keystore passphrase: ") if need_prompt else None
    keys = WorkerKeys(
        provider=load_key(settings, "provider", create=create, passphrase=passphrase),
        node=load_key(settings, "node", create=create, passphrase=passphrase),
    )
    if keys.provider.address == keys.node.address:
        raise IdentityError("the provider and node keys must differ")
    return keys


def _missing(settings: WorkerSettings, role: Role) -> NoReturn:
    raise IdentityError(
        f"no {role} key in {settings.keys_dir}: run `intellect-worker wallet create` "
        f"or set INTELLECT_WORKER_{role.upper()}_KEY"
    )
