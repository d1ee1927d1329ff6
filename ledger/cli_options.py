"""What every `intellect-pool` command shares: the chain options (`--rpc-url`, `--deployment`,
`--keystore`, `--json`) declared once, the context object built from them, token amounts and
addresses read strictly, and a transaction's report (the tx hash and gas of whatever was sent). How
a command prints (one line per error, a table, a message or `--json`) is every CLI's, in
`intellect.cli`.

The chain options may be given before the command (`intellect-pool --rpc-url URL pool 1`: the app's
callback stores them in a `Chain` context object) or after it, as every command also accepts them
(`intellect-pool pool 1 --rpc-url URL`); a value given after the command wins. Commands are declared
with `@command(app, ...)` and receive that `Chain` as their first argument, so no command repeats
the option list or the client plumbing. The command modules (cli.py, slashing_cli.py, audit_cli.py,
node_cli.py, hardware_cli.py) import from here and from nowhere else for these."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import typer
from eth_utils import is_address, is_checksum_address, is_hex_address, to_checksum_address
from rich.table import Table

from intellect.cli import emit, one_line_errors
from intellect.identity import IdentityError
from ledger.client import LedgerClient
from ledger.errors import LedgerError
from ledger.models import ONE_TOKEN, TxResult
from ledger.settings import LedgerSettings

RpcUrl = Annotated[str | None, typer.Option("--rpc-url", help="EVM JSON-RPC URL (env INTELLECT_RPC_URL)")]
DeploymentPath = Annotated[
    Path | None, typer.Option("--deployment", help="deployment file (env INTELLECT_DEPLOYMENT)")
]
Keystore = Annotated[
    Path | None, typer.Option("--keystore", help="keystore file (else env INTELLECT_PRIVATE_KEY)")
]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


# What a command may fail with that the user can fix (a pydantic error names its first field).
CHAIN_ERRORS = (LedgerError, IdentityError, ValueError, OSError)


@dataclass(frozen=True)
class Chain:
    """The context object: the chain options of one invocation and what commands build from them."""

    rpc_url: str | None = None
    deployment: Path | None = None
    keystore: Path | None = None
    as_json: bool = False

    def settings(self) -> LedgerSettings:
        given: dict[str, Any] = {
            "rpc_url": self.rpc_url,
            "deployment": self.deployment,
            "keystore": self.keystore,
        }
        return LedgerSettings(**{k: v for k, v in given.items() if v is not None})

    def signer(self) -> LedgerClient:
        """A client with the configured key (transactions): refused when none is given."""
        s = self.settings()
        return LedgerClient(s.rpc_url, s.deployment, s.require_wallet(), timeout=s.tx_timeout)

    def reader(self) -> LedgerClient:
        """A client without a key, even when one is configured: reading never asks a passphrase."""
        s = self.settings()
        return LedgerClient(s.rpc_url, s.deployment, None, timeout=s.tx_timeout)

    def emit(self, data: Any, table: Table | None = None, message: str | None = None) -> None:
        emit(data, self.as_json, table, message)

    def done(self, result: TxResult | list[TxResult], message: str) -> None:
        tx_done(result, self.as_json, message)


# The options each command may take, in the order they follow its own parameters.
_SHARED = {
    "rpc_url": inspect.Parameter("rpc_url", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=RpcUrl),
    "deployment": inspect.Parameter(
        "deployment", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=DeploymentPath
    ),
    "keystore": inspect.Parameter(
        "keystore", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Keystore
    ),
    "as_json": inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=AsJson),
}


def store_chain_options(
    ctx: typer.Context, rpc_url: str | None, deployment: Path | None, keystore: Path | None, as_json: bool
) -> None:
    """For an app callback: the options given before the command become the context object."""
    ctx.obj = Chain(rpc_url, deployment, keystore, as_json)


def command(
    app: typer.Typer,
    name: str | None = None,
    *,
    keystore: bool = True,
    deployment: bool = True,
    **kwargs: Any,
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register `fn(chain: Chain, *own params)` as a command of `app` that also takes the chain options
    (`keystore=False`: a command that never signs; `deployment=False`: one that needs no deployment).
    Failures print one line and exit 1 (`one_line_errors`)."""
    shared = [
        p for k, p in _SHARED.items() if (k != "keystore" or keystore) and (k != "deployment" or deployment)
    ]

    def register(fn: Callable[..., None]) -> Callable[..., None]:
        hints = get_type_hints(fn, include_extras=True)
        own = [
            p.replace(annotation=hints[p.name]) for p in list(inspect.signature(fn).parameters.values())[1:]
        ]

        @functools.wraps(fn)
        def run(*, typer_ctx: typer.Context, **params: Any) -> None:
            given = {k: params.pop(k) for k in _SHARED if k in params}
            base = typer_ctx.find_object(Chain) or Chain()
            chain = replace(base, **{k: v for k, v in given.items() if v not in (None, False)})
            with one_line_errors(*CHAIN_ERRORS):
                fn(chain, **params)

        # typer reads this signature (fn's own parameters, then the chain options), not fn's.
        del run.__dict__["__wrapped__"]
        ctx = inspect.Parameter("typer_ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
        run.__dict__["__signature__"] = inspect.Signature([*own, *shared, ctx], return_annotation=None)
        run.__annotations__ = {p.name: p.annotation for p in [*own, *shared, ctx]}
        app.command(name, **kwargs)(run)
        return fn

    return register


def tokens(text: str) -> int:
    """'12.5' tokens -> base units."""
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise LedgerError(f"not a token amount: {text!r} (e.g. 200 or 0.5)") from None
    if value < 0:
        raise LedgerError(f"token amount must not be negative: {text}")
    return int(value * ONE_TOKEN)


def fmt_tokens(base: int) -> str:
    return f"{Decimal(base) / ONE_TOKEN:f}"


def address(text: str, what: str = "address") -> str:
    """A checksummed address. Mixed case means an EIP-55 checksum: a wrong one is refused (a typo
    would send stake or rewards elsewhere); all-lower or all-upper hex carries none and is accepted."""
    digits = text[2:]
    mixed_case = digits != digits.lower() and digits != digits.upper()
    if is_hex_address(text) and mixed_case and not is_checksum_address(text):
        raise LedgerError(
            f"{what} {text} has a wrong EIP-55 checksum (a typo?); its checksummed form would be "
            f"{to_checksum_address(text)}: check the address, then pass that form or all lower case"
        )
    if not is_address(text):
        raise LedgerError(f"{what} {text!r} is not a 0x-prefixed 20-byte address (0x + 40 hex digits)")
    return to_checksum_address(text)


def tx_done(result: TxResult | list[TxResult], as_json: bool, message: str) -> None:
    results = result if isinstance(result, list) else [result]
    data = {"message": message, "transactions": [r.model_dump(mode="json") for r in results]}
    gas = sum(r.gas_used for r in results)
    emit(data, as_json, message=f"[green]ok[/green] {message} (gas {gas}, tx {results[-1].tx_hash})")
