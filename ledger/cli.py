"""`intellect-pool`: the pool owner's command line (deploy, domains, pools, membership, work, slashing).

Keys come from `--keystore` (passphrase: INTELLECT_KEYSTORE_PASSPHRASE or a prompt) or the
INTELLECT_PRIVATE_KEY environment variable; the chain from `--rpc-url` or INTELLECT_RPC_URL.
Every failure prints one line naming what to fix and exits with code 1.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from intellect.logs import setup_logging
from ledger import node_cli
from ledger.audit_cli import audit
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
    kv_table,
    settings,
    tokens,
    tx_done,
)
from ledger.deploy import DeployParams, deploy_all
from ledger.errors import LedgerError
from ledger.invites import sign_invite
from ledger.slashing_cli import app as slashing_app

app = typer.Typer(
    name="intellect-pool",
    help="Pool owner's tools for the Intellect ledger: deploy, domains, pools, nodes, work, slashing.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

@app.callback()
def _set_up_logging() -> None:
    # Every command of this CLI logs through the one set-up (INTELLECT_LOG_FORMAT / INTELLECT_LOG_LEVEL).
    setup_logging()

# ---- deployment ----


@app.command()
@clean_errors
def deploy(
    out_path: Annotated[Path, typer.Option("--out", help="where to write the deployment file")] = Path(
        "deployment.json"
    ),
    stake_minimum: Annotated[str, typer.Option(help="stake per compute unit, tokens")] = "10",
    reward_per_unit: Annotated[str, typer.Option(help="reward per work unit, tokens")] = "1",
    reward_lock: Annotated[int, typer.Option(help="seconds rewards stay locked")] = 86400,
    invalidation_window: Annotated[int, typer.Option(help="seconds validators may invalidate work")] = 86400,
    slash_penalty: Annotated[str, typer.Option(help="stake slashed per invalidation, tokens")] = "200",
    unbonding_period: Annotated[
        int, typer.Option(help="seconds before unbonded stake is claimable")
    ] = 604800,
    validator: Annotated[list[str] | None, typer.Option(help="grant VALIDATOR_ROLE (repeatable)")] = None,
    rpc_url: RpcUrl = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Deploy all contracts in order and write the deployment file."""
    s = settings(rpc_url, None, keystore)
    params = DeployParams(
        stake_minimum=tokens(stake_minimum),
        reward_per_unit=tokens(reward_per_unit),
        reward_lock_period=reward_lock,
        invalidation_window=invalidation_window,
        slash_penalty=tokens(slash_penalty),
        unbonding_period=unbonding_period,
        validators=[address(v, "validator") for v in validator or []],
    )
    try:
        deployment = deploy_all(s.rpc_url, s.require_wallet(), params, timeout=s.tx_timeout)
    except (ConnectionError, OSError) as exc:
        raise LedgerError(f"cannot reach the chain at {s.rpc_url}: {exc}") from None
    deployment.save(out_path)
    table = Table(title=f"deployed on chain {deployment.chain_id} at block {deployment.block}")
    table.add_column("contract")
    table.add_column("address")
    for name, addr in deployment.addresses.items():
        table.add_row(name, addr)
    emit(deployment, as_json, table, f"deployment written to {out_path}")


# ---- domains and pools ----


@app.command("create-domain")
@clean_errors
def create_domain(
    name: Annotated[str, typer.Argument(help="domain name, e.g. math-rollouts")],
    parameters_uri: Annotated[str, typer.Option(help="URI of the domain's parameters")] = "",
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Create a domain (federator role)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    domain_id = c.create_domain(name, parameters_uri)
    emit({"domain_id": domain_id}, as_json, message=f"[green]ok[/green] domain {domain_id} created")


@app.command("create-pool")
@clean_errors
def create_pool(
    domain_id: Annotated[int, typer.Option("--domain-id", help="domain the pool belongs to")],
    name: Annotated[str, typer.Option(help="pool name")],
    manager: Annotated[str | None, typer.Option(help="manager key that signs invites [default: you]")] = None,
    data_uri: Annotated[str, typer.Option(help="URI of the pool's data and hardware requirements")] = "",
    compute_limit: Annotated[int, typer.Option(help="max total compute units, 0 = unlimited")] = 0,
    start: Annotated[bool, typer.Option("--start", help="start the pool right away")] = False,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Create a compute pool; you become its creator (start, end, eject, blacklist)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    mgr = address(manager, "manager") if manager else c.address
    pool_id = c.create_pool(domain_id, mgr, name, data_uri, compute_limit)
    if start:
        c.start_pool(pool_id)
    emit({"pool_id": pool_id, "started": start}, as_json, message=f"[green]ok[/green] pool {pool_id} created")


@app.command("start-pool")
@clean_errors
def start_pool(
    pool_id: int,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Open a pool for joins and work."""
    tx_done(
        client(rpc_url, deployment, keystore, signer=True).start_pool(pool_id),
        as_json,
        f"pool {pool_id} started",
    )


@app.command("end-pool")
@clean_errors
def end_pool(
    pool_id: int,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """End a pool: no more joins or work; its nodes are released."""
    tx_done(
        client(rpc_url, deployment, keystore, signer=True).end_pool(pool_id), as_json, f"pool {pool_id} ended"
    )


@app.command()
@clean_errors
def pool(
    pool_id: int,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    as_json: AsJson = False,
) -> None:
    """Show a pool."""
    p = client(rpc_url, deployment, None, signer=False).get_pool(pool_id)
    rows = p.model_dump()
    rows["status"] = p.status.name
    emit(p, as_json, kv_table(f"pool {pool_id}", rows))


@app.command()
@clean_errors
def invite(
    pool_id: int,
    node: Annotated[str, typer.Argument(help="node address to invite")],
    ttl: Annotated[int, typer.Option(min=1, help="seconds until the invite expires")] = 3600,
    nonce: Annotated[int | None, typer.Option(min=0, help="invite nonce [default: random]")] = None,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Sign an invite with the manager key (your key must be the pool's manager)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    p = c.get_pool(pool_id)
    if p.manager != c.address:
        raise LedgerError(f"your key {c.address} is not pool {pool_id}'s manager {p.manager}: use --keystore")
    inv = sign_invite(
        c.wallet,  # type: ignore[arg-type]
        p.domain_id,
        pool_id,
        address(node, "node"),
        nonce if nonce is not None else secrets.randbits(64),
        c.timestamp() + ttl,
    )
    emit(inv, as_json, kv_table(f"invite to pool {pool_id}", inv.model_dump()))


# ---- providers and nodes ----


@app.command("whitelist-provider")
@clean_errors
def whitelist_provider(
    provider: str,
    remove: Annotated[bool, typer.Option("--remove", help="take the provider off the whitelist")] = False,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Whitelist a provider (federator role)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    result = c.whitelist_provider(address(provider, "provider"), not remove)
    tx_done(result, as_json, f"provider {provider} {'removed from' if remove else 'added to'} the whitelist")


@app.command("blacklist-provider")
@clean_errors
def blacklist_provider(
    provider: str,
    pool_id: Annotated[
        int | None, typer.Option("--pool", help="ban only from this pool (pool manager), ejecting its nodes")
    ] = None,
    remove: Annotated[bool, typer.Option("--remove", help="lift a registry-wide ban")] = False,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Ban a provider registry-wide (federator role) or from one pool (--pool)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    addr = address(provider, "provider")
    if pool_id is not None:
        tx_done(
            c.blacklist_pool_provider(pool_id, addr), as_json, f"provider {addr} banned from pool {pool_id}"
        )
    else:
        tx_done(c.blacklist_provider(addr, not remove), as_json, f"provider {addr} blacklist={not remove}")


@app.command()
@clean_errors
def nodes(
    pool_id: int,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    as_json: AsJson = False,
) -> None:
    """List a pool's nodes with their on-chain status."""
    c = client(rpc_url, deployment, None, signer=False)
    rows = []
    for addr in c.pool_nodes(pool_id):
        n = c.get_node(addr)
        prov = c.get_provider(n.provider) if n else None
        rows.append(
            {
                "node": addr,
                "provider": n.provider if n else None,
                "compute_units": n.compute_units if n else 0,
                "validated": n.validated if n else False,
                "provider_stake": prov.stake if prov else 0,
                "provider_blacklisted": prov.blacklisted if prov else False,
                "pending_rewards": c.pending_rewards(addr),
                "claimable_rewards": c.claimable_rewards(addr),
            }
        )
    table = Table(title=f"pool {pool_id}: {len(rows)} node(s)")
    for col in ("node", "provider", "units", "validated", "stake", "pending", "claimable"):
        table.add_column(col)
    for r in rows:
        amounts = (r["provider_stake"], r["pending_rewards"], r["claimable_rewards"])
        validated = "yes" if r["validated"] else "no"
        row = [r["node"], r["provider"] or "-", str(r["compute_units"]), validated]
        table.add_row(*row, *(fmt_tokens(a) for a in amounts))
    emit(rows, as_json, table)


@app.command()
@clean_errors
def eject(
    pool_id: int,
    node: str,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Eject a node from a pool (it may rejoin with a new invite)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    tx_done(c.eject_node(pool_id, address(node, "node")), as_json, f"node {node} ejected from pool {pool_id}")


@app.command("blacklist-node")
@clean_errors
def blacklist_node(
    pool_id: int,
    node: str,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Ban a node from a pool for good (ejecting it if present)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    tx_done(
        c.blacklist_node(pool_id, address(node, "node")), as_json, f"node {node} banned from pool {pool_id}"
    )


# ---- work ----


@app.command()
@clean_errors
def work(
    pool_id: int,
    since: Annotated[int, typer.Option(min=0, help="only work submitted at or after this unix time")] = 0,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    as_json: AsJson = False,
) -> None:
    """List accepted (not invalidated) work submissions of a pool, oldest first."""
    c = client(rpc_url, deployment, None, signer=False)
    c.get_pool(pool_id)  # PoolNotFound for a pool that does not exist, as every other command says
    records = c.work_since(pool_id, since)
    table = Table(title=f"pool {pool_id}: {len(records)} submission(s)")
    for col in ("time", "work key", "node", "units", "reward", "status"):
        table.add_column(col)
    for r in records:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.timestamp))
        # Not invalidated itself, but its node was slashed for another file: its reward was dropped.
        state = "reward dropped (node slashed)" if r.units and not r.reward else "accepted"
        table.add_row(when, r.work_key, r.node, str(r.units), fmt_tokens(r.reward), state)
    emit(records, as_json, table)


@app.command()
@clean_errors
def invalidate(
    pool_id: int,
    work_key: Annotated[str, typer.Argument(help="0x hex of the 32-byte work key")],
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Reject work: slash the provider, drop the node's locked rewards, eject the node (validator role)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    result = c.invalidate_work(pool_id, work_key)
    ev = result.event("WorkInvalidated")
    slashed = fmt_tokens(ev.args["slashed"]) if ev else "?"
    tx_done(result, as_json, f"work {work_key} invalidated; provider slashed {slashed} tokens")


@app.command("soft-invalidate")
@clean_errors
def soft_invalidate(
    pool_id: int,
    work_key: Annotated[str, typer.Argument(help="0x hex of the 32-byte work key")],
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Reject work without penalty (validator role)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    tx_done(c.soft_invalidate_work(pool_id, work_key), as_json, f"work {work_key} soft-invalidated")


# ---- settings, roles, funds ----


@app.command("set-stake-minimum")
@clean_errors
def set_stake_minimum(
    amount: Annotated[str, typer.Argument(help="tokens of stake per compute unit")],
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Set the stake required per compute unit (admin)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    tx_done(c.set_stake_minimum(tokens(amount)), as_json, f"stake minimum set to {amount} tokens")


@app.command("grant-validator")
@clean_errors
def grant_validator(
    account: str,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Grant VALIDATOR_ROLE (invalidate work, validate nodes) to an address (admin)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    tx_done(c.grant_validator(address(account)), as_json, f"{account} is now a validator")


@app.command("grant-federator")
@clean_errors
def grant_federator(
    account: str,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Grant FEDERATOR_ROLE (domains, provider white/blacklists) to an address (admin)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    tx_done(c.grant_federator(address(account)), as_json, f"{account} is now a federator")


# `mint ADDR -5` would otherwise be read as an unknown option "-5": let it reach `tokens`, which names
# the problem (a negative amount).
@app.command(context_settings={"ignore_unknown_options": True})
@clean_errors
def mint(
    to: str,
    amount: Annotated[str, typer.Argument(help="tokens to mint")],
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Mint tokens (devnets; minter role)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    tx_done(c.mint(address(to), tokens(amount)), as_json, f"minted {amount} tokens to {to}")


@app.command()
@clean_errors
def balances(
    accounts: Annotated[list[str] | None, typer.Argument(help="addresses [default: your key's]")] = None,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Token, ETH, stake and reward balances of addresses."""
    c = client(rpc_url, deployment, keystore, signer=not accounts)
    targets = [address(a) for a in accounts] if accounts else [c.address]
    rows = []
    for a in targets:
        prov = c.get_provider(a)
        rows.append(
            {
                "address": a,
                "tokens": c.balance_of(a),
                "eth": c.eth_balance(a),
                "stake": prov.stake,
                "unbonding": sum(u.amount for u in c.unbonds(a)),
                "pending_rewards": c.pending_rewards(a),
                "claimable_rewards": c.claimable_rewards(a),
            }
        )
    table = Table(title="balances (tokens)")
    for col in ("address", "tokens", "eth", "stake", "unbonding", "pending rewards", "claimable rewards"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["address"], *(fmt_tokens(r[k]) for k in list(r)[1:]))
    emit(rows, as_json, table)


@app.command("claim-rewards")
@clean_errors
def claim_rewards(
    node: str,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Pay a node's matured rewards to its provider (the provider's or node's key)."""
    c = client(rpc_url, deployment, keystore, signer=True)
    result = c.claim_rewards(address(node, "node"))
    ev = result.event("RewardsClaimed")
    tx_done(result, as_json, f"claimed {fmt_tokens(ev.args['amount']) if ev else '?'} tokens")


app.add_typer(slashing_app, name="slashing")
app.command("audit")(audit)
app.command("join")(node_cli.join)
app.command("submit-work")(node_cli.submit_work)

if __name__ == "__main__":
    app()
