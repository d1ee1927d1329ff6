"""`intellect-pool join` and `intellect-pool submit-work`: what a worker does on its own, by hand.

For operators recovering a node whose worker cannot (its state lost, its orchestrator gone): join a
pool with an invite the manager signed (`intellect-pool invite --json > invite.json`), or record a
rollout file that was uploaded but never submitted. Both are sent with the provider's key (or the
node's); the contract checks the same things as for the worker.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from ledger.cli_options import (
    Chain,
    address,
)
from ledger.contracts.slashing import work_key_bytes
from ledger.errors import LedgerError
from ledger.invites import Invite

PoolId = Annotated[int, typer.Argument(min=1, help="pool id")]
Node = Annotated[str, typer.Argument(help="node address")]


def _invite(path: Path) -> Invite:
    try:
        return Invite.model_validate(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError) as exc:
        raise LedgerError(f"cannot read the invite {path}: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        raise LedgerError(f"{path} is not an invite ({'.'.join(map(str, first['loc']))}: {first['msg']}); "
                          "make one with `intellect-pool invite POOL NODE --json`") from None  # fmt: skip


def join(
    chain: Chain,
    pool_id: PoolId,
    node: Node,
    invite: Annotated[Path, typer.Option("--invite", help="the manager's invite (`invite --json` output)")],
) -> None:
    """Join NODE to the pool with the manager's signed invite (provider's or node's key)."""
    c = chain.signer()
    signed = _invite(invite)
    if signed.signer() != c.get_pool(pool_id).manager:
        raise LedgerError(f"{invite} is not signed by pool {pool_id}'s manager: ask them for a new one")
    result = c.join_pool(pool_id, address(node, "node"), signed)
    chain.done(result, f"node {node} joined pool {pool_id}")


def submit_work(
    chain: Chain,
    pool_id: PoolId,
    node: Node,
    units: Annotated[int, typer.Argument(min=1, help="work units the file is worth")],
    file: Annotated[Path | None, typer.Option("--file", help="the rollout file (sha256: the key)")] = None,
    work_key: Annotated[str | None, typer.Option("--work-key", help="0x + 64 hex: the file's sha256")] = None,
) -> None:
    """Record a file's work on chain for NODE (the provider's key): give --file or --work-key."""
    if (file is None) == (work_key is None):
        raise LedgerError("give exactly one of --file PATH or --work-key 0x<64 hex>")
    if file is not None:
        try:
            with file.open("rb") as fh:
                work_key = "0x" + hashlib.file_digest(fh, "sha256").hexdigest()
        except OSError as exc:
            raise LedgerError(f"cannot read {file}: {exc}") from None
    key = work_key_bytes(work_key or "")
    c = chain.signer()
    result = c.submit_work(pool_id, address(node, "node"), key, units)
    chain.done(result, f"work 0x{key.hex()} ({units} units) recorded for node {node} in pool {pool_id}")
