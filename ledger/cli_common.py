"""What every `intellect-pool` command shares: option types, the one-line error wrapper, the ledger
client from flags/env, token amounts and addresses read strictly, and output (table, message or
`--json`, with the tx hash and gas of whatever was sent). The command modules (cli.py, slashing_cli.py,
audit_cli.py) import from here and from nowhere else for these."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from eth_utils import is_address, is_checksum_address, is_hex_address, to_checksum_address
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.table import Table

from intellect.identity import IdentityError
from ledger.client import LedgerClient
from ledger.errors import LedgerError
from ledger.models import ONE_TOKEN, TxResult
from ledger.settings import LedgerSettings

out = Console(soft_wrap=True)  # messages never break inside an address or hash
err = Console(stderr=True, soft_wrap=True)  # one unwrapped line per error

RpcUrl = Annotated[str | None, typer.Option("--rpc-url", help="EVM JSON-RPC URL [env INTELLECT_RPC_URL]")]
DeploymentPath = Annotated[
    Path | None, typer.Option("--deployment", help="deployment file [env INTELLECT_DEPLOYMENT]")
]
Keystore = Annotated[
    Path | None, typer.Option("--keystore", help="keystore file (else env INTELLECT_PRIVATE_KEY)")
]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]

F = TypeVar("F", bound=Callable[..., Any])


def clean_errors(fn: F) -> F:
    """One line on stderr and exit code 1 instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (LedgerError, IdentityError) as exc:
            err.print(f"[red]error:[/red] {exc}", highlight=False)
        except ValidationError as exc:
            first = exc.errors()[0]
            err.print(
                f"[red]error:[/red] {'.'.join(map(str, first['loc']))}: {first['msg']}", highlight=False
            )
        except (ValueError, OSError) as exc:
            err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(1)

    return wrapper  # type: ignore[return-value]


def settings(rpc_url: str | None, deployment: Path | None, keystore: Path | None) -> LedgerSettings:
    overrides: dict[str, Any] = {"rpc_url": rpc_url, "deployment": deployment, "keystore": keystore}
    return LedgerSettings(**{k: v for k, v in overrides.items() if v is not None})


def client(
    rpc_url: str | None, deployment: Path | None, keystore: Path | None, *, signer: bool
) -> LedgerClient:
    s = settings(rpc_url, deployment, keystore)
    wallet = s.require_wallet() if signer else s.wallet()
    return LedgerClient(s.rpc_url, s.deployment, wallet, timeout=s.tx_timeout)


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


def emit(data: Any, as_json: bool, table: Table | None = None, message: str | None = None) -> None:
    if as_json:
        if isinstance(data, BaseModel):
            data = data.model_dump(mode="json")
        elif isinstance(data, list):
            data = [d.model_dump(mode="json") if isinstance(d, BaseModel) else d for d in data]
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        return
    if table is not None:
        out.print(table)
    if message:
        out.print(message, highlight=False)


def tx_done(result: TxResult | list[TxResult], as_json: bool, message: str) -> None:
    results = result if isinstance(result, list) else [result]
    data = {"message": message, "transactions": [r.model_dump(mode="json") for r in results]}
    gas = sum(r.gas_used for r in results)
    emit(data, as_json, message=f"[green]ok[/green] {message} (gas {gas}, tx {results[-1].tx_hash})")


def kv_table(title: str, rows: dict[str, Any]) -> Table:
    table = Table(title=title, show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for k, v in rows.items():
        table.add_row(k, str(v))
    return table
