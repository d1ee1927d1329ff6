"""`intellect-worker wallet`: create, import and show the provider and node keys."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from intellect.cli import show_rows
from intellect.identity import Wallet, resolve_passphrase
from worker.cli_options import CliError, JsonOut, StateDir, build_settings, friendly
from worker.keys import keystore_path, load_key, load_keys

wallet_app = typer.Typer(help="Create, import and show the provider and node keys.", no_args_is_help=True)

Role = Literal["provider", "node"]


def _roles(role: str) -> list[Role]:
    if role not in ("provider", "node", "both"):
        raise CliError("--role must be provider, node or both")
    if role == "provider":
        return ["provider"]
    return ["node"] if role == "node" else ["provider", "node"]


@wallet_app.command("create")
@friendly
def wallet_create(
    state_dir: StateDir = None,
    role: Annotated[str, typer.Option(help="provider | node | both")] = "both",
    json_out: JsonOut = False,
) -> None:
    """Create encrypted keystores (existing ones are kept)."""
    settings = build_settings(state_dir=state_dir)
    passphrase = resolve_passphrase("New keystore passphrase: ")
    rows = []
    for r in _roles(role):
        existed = keystore_path(settings, r).exists()
        wallet = load_key(settings.model_copy(update={"provider_key": None, "node_key": None}), r,
                          create=True, passphrase=passphrase)
        rows.append({"role": r, "address": wallet.address, "created": not existed,
                     "keystore": str(keystore_path(settings, r))})
    show_rows(rows, json_out, "Keys")


@wallet_app.command("import")
@friendly
def wallet_import(
    role: Annotated[str, typer.Option(help="provider | node (one key at a time)")],
    state_dir: StateDir = None,
    private_key: Annotated[str | None, typer.Option(help="hex key (prompted, hidden, when omitted)")] = None,
    force: Annotated[bool, typer.Option(help="overwrite an existing keystore")] = False,
    json_out: JsonOut = False,
) -> None:
    """Import a private key into an encrypted keystore."""
    settings = build_settings(state_dir=state_dir)
    if role not in ("provider", "node"):
        raise CliError("--role must be provider or node (import one key at a time)")
    r: Role = "provider" if role == "provider" else "node"
    path = keystore_path(settings, r)
    if path.exists() and not force:
        raise CliError(f"{path} exists: pass --force to overwrite it")
    key = private_key or typer.prompt(f"{r} private key", hide_input=True)
    wallet = Wallet.from_key(key.strip())
    wallet.save(path, resolve_passphrase("Keystore passphrase: "))
    show_rows([{"role": r, "address": wallet.address, "keystore": str(path)}], json_out, "Imported")


@wallet_app.command("show")
@friendly
def wallet_show(
    state_dir: StateDir = None,
    show_private_key: Annotated[bool, typer.Option("--show-private-key", help="also print the keys")] = False,
    json_out: JsonOut = False,
) -> None:
    """The provider and node addresses (keys only with --show-private-key)."""
    settings = build_settings(state_dir=state_dir)
    keys = load_keys(settings, create=False)
    rows = []
    for r in ("provider", "node"):
        wallet: Wallet = getattr(keys, r)
        row = {"role": r, "address": wallet.address}
        if show_private_key:
            row["private_key"] = wallet.private_key_hex()
        rows.append(row)
    show_rows(rows, json_out, "Keys")
