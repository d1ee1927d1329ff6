"""`intellect-pool slashing …`: a pool owner's slashing policy, validators, verdicts and pardons.

intellect-pool slashing policy show 1
intellect-pool slashing policy set 1 --quorum 2 --amount 200 --window 86400
intellect-pool slashing validators add 1 0xVALIDATOR      (add | remove | list)
intellect-pool slashing vote 1 0xWORKKEY [--soft]         (as a validator)
intellect-pool slashing verdicts 1 [--validator-url URL]  (votes on chain, reasons from validators)
intellect-pool slashing pardon 1 0xWORKKEY                (owner: reverse a soft invalidation)
"""

from __future__ import annotations

from typing import Annotated, Any

import httpx
import typer
from rich.table import Table

from ledger.cli_common import (
    AsJson,
    DeploymentPath,
    Keystore,
    RpcUrl,
    address,
    clean_errors,
    client,
    emit,
    fmt_tokens,
    tokens,
    tx_done,
)
from ledger.errors import LedgerError

app = typer.Typer(
    help="Slashing by quorum: policy, validators, votes, verdicts, pardons.", no_args_is_help=True
)
policy_app = typer.Typer(
    help="A pool's slashing policy (k-of-n quorum, amount, window).", no_args_is_help=True
)
validators_app = typer.Typer(help="The validators a pool counts votes from.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")
app.add_typer(validators_app, name="validators")

PoolId = Annotated[int, typer.Argument(min=1, help="pool id")]
WorkKey = Annotated[str, typer.Argument(help="0x + 64 hex digits: the file's sha256 recorded on chain")]


@policy_app.command("show")
@clean_errors
def policy_show(
    pool_id: PoolId, rpc_url: RpcUrl = None, deployment: DeploymentPath = None, as_json: AsJson = False
) -> None:
    """The pool's policy (quorum 0: none set; one vote of a global validator decides)."""
    c = client(rpc_url, deployment, None, signer=False)
    c.get_pool(pool_id)  # PoolNotFound for a pool that does not exist
    p = c.slashing.policy(pool_id)
    table = Table(title=f"slashing policy of pool {pool_id}", show_header=False)
    table.add_row(
        "quorum",
        f"{p.quorum} of {len(c.slashing.validators(pool_id))} validators"
        if p.quorum
        else "none set (one global validator's vote)",
    )
    table.add_row("slash amount", f"{fmt_tokens(p.slash_amount)} tokens")
    table.add_row("window", f"{p.window_seconds} s")
    emit(p, as_json, table)


@policy_app.command("set")
@clean_errors
def policy_set(
    pool_id: PoolId,
    quorum: Annotated[int, typer.Option(min=1, help="votes needed to slash (k of the pool's n validators)")],
    amount: Annotated[str, typer.Option(help="tokens slashed from the provider's stake, e.g. 200")],
    window: Annotated[
        int, typer.Option(min=1, help="seconds after submission during which votes count")
    ] = 86400,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Set the policy (pool creator or manager). Name the validators first: k must not exceed n."""
    c = client(rpc_url, deployment, keystore, signer=True)
    result = c.slashing.set_policy(pool_id, quorum, tokens(amount), window)
    tx_done(result, as_json, f"pool {pool_id}: {quorum}-vote quorum, {amount} tokens, {window} s window")


@validators_app.command("add")
@clean_errors
def validators_add(
    pool_id: PoolId,
    validator: str,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Count this address's votes in the pool (creator or manager)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    tx_done(
        c.slashing.add_validator(pool_id, address(validator, "validator")),
        as_json,
        f"{validator} validates pool {pool_id}",
    )


@validators_app.command("remove")
@clean_errors
def validators_remove(
    pool_id: PoolId,
    validator: str,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Stop counting this address's votes (refused if the quorum could no longer be reached)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    tx_done(
        c.slashing.remove_validator(pool_id, address(validator, "validator")),
        as_json,
        f"{validator} no longer validates pool {pool_id}",
    )


@validators_app.command("list")
@clean_errors
def validators_list(
    pool_id: PoolId, rpc_url: RpcUrl = None, deployment: DeploymentPath = None, as_json: AsJson = False
) -> None:
    """The pool's validators."""
    c = client(rpc_url, deployment, None, signer=False)
    c.get_pool(pool_id)
    names = c.slashing.validators(pool_id)
    table = Table(title=f"validators of pool {pool_id} ({len(names)})")
    table.add_column("address")
    for n in names:
        table.add_row(n)
    emit(names, as_json, table)


@app.command("vote")
@clean_errors
def vote(
    pool_id: PoolId,
    work_key: WorkKey,
    soft: Annotated[bool, typer.Option(help="no slash: soft-invalidate")] = False,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Vote as a validator (the validator service does this by itself)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    result = (c.slashing.vote_soft_invalidate if soft else c.slashing.vote_invalidate)(pool_id, work_key)
    decided = result.event("WorkInvalidated") or result.event("WorkSoftInvalidated")
    voted = result.event("InvalidationVoted")
    what = (
        "decided: " + decided.name
        if decided
        else (f"vote {voted.args['votes']} counted" if voted else "already decided: nothing to do")
    )
    tx_done(result, as_json, f"work {work_key}: {what}")


@app.command("pardon")
@clean_errors
def pardon(
    pool_id: PoolId,
    work_key: WorkKey,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Reverse a soft invalidation still inside the reward lock (creator or manager)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    tx_done(c.slashing.pardon(pool_id, work_key), as_json, f"work {work_key} counts again")


@app.command("verdicts")
@clean_errors
def verdicts(
    pool_id: PoolId,
    validator_url: Annotated[list[str], typer.Option("--validator-url", help="validator API (repeat)")] = [],  # noqa: B006
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    as_json: AsJson = False,
) -> None:
    """What each validator decided about each work key: votes from the chain's events, reasons from
    the validators' `GET /verdicts` when their URLs are given."""
    c = client(rpc_url, deployment, None, signer=False)
    c.get_pool(pool_id)
    rows: list[dict[str, Any]] = []
    logs = c.pools.events.InvalidationVoted().get_logs(
        from_block=c.deployment.block, argument_filters={"poolId": pool_id}
    )
    for log in logs:
        rows.append(
            {
                "work_key": "0x" + bytes(log["args"]["workKey"]).hex(),
                "validator": log["args"]["validator"],
                "vote": "soft" if log["args"]["soft"] else "invalidate",
                "votes": log["args"]["votes"],
                "tx": "0x" + bytes(log["transactionHash"]).hex(),
                "reasons": "",
            }
        )
    for url in validator_url:
        try:
            body = httpx.get(
                url.rstrip("/") + "/verdicts", params={"pool": pool_id, "limit": 1000}, timeout=10
            ).json()
        except (httpx.HTTPError, ValueError) as exc:
            raise LedgerError(f"validator {url} unreachable: {exc}") from None
        for v in body.get("items", []):
            rows.append(
                {
                    "work_key": v["work_key"],
                    "validator": url,
                    "vote": v["verdict"],
                    "votes": None,
                    "tx": v.get("tx_hash"),
                    "reasons": "; ".join(v.get("reasons") or []),
                }
            )
    table = Table(title=f"verdicts in pool {pool_id} ({len(rows)})")
    for col in ("work_key", "validator", "vote", "votes", "tx", "reasons"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            *(
                str(r[k]) if r[k] is not None else ""
                for k in ("work_key", "validator", "vote", "votes", "tx", "reasons")
            )
        )
    emit(rows, as_json, table)
