"""`intellect-pool slashing …`: a pool owner's slashing policy, validators, verdicts and pardons.

intellect-pool slashing policy show 1
intellect-pool slashing policy set 1 --quorum 2 --amount 200 --window 86400
intellect-pool slashing validators add 1 0xVALIDATOR      (add | remove | list)
intellect-pool slashing vote 1 0xWORKKEY [--soft]         (as a validator)
intellect-pool slashing verdicts 1 [--validator-url URL]  (votes on chain, reasons from validators)
intellect-pool slashing pardon 1 0xWORKKEY                (owner: reverse a soft invalidation)
intellect-pool slashing hardware 1 0xNODE --orchestrator URL (a wrong hardware answer, judged first)
"""

from __future__ import annotations

from typing import Annotated, Any

import httpx
import typer
from rich.table import Table

from ledger.cli_options import (
    Chain,
    address,
    command,
    fmt_tokens,
    tokens,
)
from ledger.errors import LedgerError
from ledger.hardware_cli import slash_hardware

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


@command(policy_app, "show", keystore=False)
def policy_show(
    chain: Chain,
    pool_id: PoolId,
) -> None:
    """The pool's policy (quorum 0: none set; one vote of a global validator decides)."""
    c = chain.reader()
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
    chain.emit(p, table)


@command(policy_app, "set")
def policy_set(
    chain: Chain,
    pool_id: PoolId,
    quorum: Annotated[int, typer.Option(min=1, help="votes needed to slash (k of the pool's n validators)")],
    amount: Annotated[str, typer.Option(help="tokens slashed from the provider's stake, e.g. 200")],
    window: Annotated[
        int, typer.Option(min=1, help="seconds after submission during which votes count")
    ] = 86400,
) -> None:
    """Set the policy (pool creator or manager). Name the validators first: k must not exceed n."""
    c = chain.signer()
    result = c.slashing.set_policy(pool_id, quorum, tokens(amount), window)
    chain.done(result, f"pool {pool_id}: {quorum}-vote quorum, {amount} tokens, {window} s window")


@command(validators_app, "add")
def validators_add(
    chain: Chain,
    pool_id: PoolId,
    validator: str,
) -> None:
    """Count this address's votes in the pool (creator or manager)."""
    c = chain.signer()
    chain.done(
        c.slashing.add_validator(pool_id, address(validator, "validator")),
        f"{validator} validates pool {pool_id}",
    )


@command(validators_app, "remove")
def validators_remove(
    chain: Chain,
    pool_id: PoolId,
    validator: str,
) -> None:
    """Stop counting this address's votes (refused if the quorum could no longer be reached)."""
    c = chain.signer()
    chain.done(
        c.slashing.remove_validator(pool_id, address(validator, "validator")),
        f"{validator} no longer validates pool {pool_id}",
    )


@command(validators_app, "list", keystore=False)
def validators_list(
    chain: Chain,
    pool_id: PoolId,
) -> None:
    """The pool's validators."""
    c = chain.reader()
    c.get_pool(pool_id)
    names = c.slashing.validators(pool_id)
    table = Table(title=f"validators of pool {pool_id} ({len(names)})")
    table.add_column("address")
    for n in names:
        table.add_row(n)
    chain.emit(names, table)


@command(app, "vote")
def vote(
    chain: Chain,
    pool_id: PoolId,
    work_key: WorkKey,
    soft: Annotated[bool, typer.Option(help="no slash: soft-invalidate")] = False,
) -> None:
    """Vote as a validator (the validator service does this by itself)."""
    c = chain.signer()
    result = (c.slashing.vote_soft_invalidate if soft else c.slashing.vote_invalidate)(pool_id, work_key)
    decided = result.event("WorkInvalidated") or result.event("WorkSoftInvalidated")
    voted = result.event("InvalidationVoted")
    what = (
        "decided: " + decided.name
        if decided
        else (f"vote {voted.args['votes']} counted" if voted else "already decided: nothing to do")
    )
    chain.done(result, f"work {work_key}: {what}")


@command(app, "pardon")
def pardon(
    chain: Chain,
    pool_id: PoolId,
    work_key: WorkKey,
) -> None:
    """Reverse a soft invalidation still inside the reward lock (creator or manager)."""
    c = chain.signer()
    chain.done(c.slashing.pardon(pool_id, work_key), f"work {work_key} counts again")


@command(app, "verdicts", keystore=False)
def verdicts(
    chain: Chain,
    pool_id: PoolId,
    validator_url: Annotated[list[str], typer.Option("--validator-url", help="validator API (repeat)")] = [],  # noqa: B006
) -> None:
    """What each validator decided about each work key: votes from the chain's events, reasons from
    the validators' `GET /verdicts` when their URLs are given."""
    c = chain.reader()
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
    chain.emit(rows, table)


command(app, "hardware")(slash_hardware)
