"""`intellect-pool`: the pool owner's command line (deploy, domains, pools, membership, work, slashing).

Keys come from `--keystore` (passphrase: INTELLECT_KEYSTORE_PASSPHRASE or a prompt) or the
INTELLECT_PRIVATE_KEY environment variable; the chain from `--rpc-url` or INTELLECT_RPC_URL.
Every failure prints one line naming what to fix and exits with code 1.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from intellect.cli import kv_table
from intellect.logs import setup_logging
from ledger import node_cli
from ledger.audit_cli import audit
from ledger.cli_options import (
    AsJson,
    Chain,
    DeploymentPath,
    Keystore,
    RpcUrl,
    address,
    command,
    fmt_tokens,
    store_chain_options,
    tokens,
)
from ledger.deploy import DeployParams, deploy_all
from ledger.errors import LedgerError
from ledger.hardware_cli import AdminToken, OrchestratorUrl, hardware_evidence, proven_by_node, proven_cells
from ledger.invites import sign_invite
from ledger.slashing_cli import app as slashing_app

app = typer.Typer(
    name="intellect-pool",
    help="Pool owner's tools for the Intellect ledger: deploy, domains, pools, nodes, work, slashing.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def _chain_options(
    ctx: typer.Context,
    rpc_url: RpcUrl = None,
    deployment: DeploymentPath = None,
    keystore: Keystore = None,
    as_json: AsJson = False,
) -> None:
    """Chain options given here hold for the command that follows (which may also take them)."""
    # Every command of this CLI logs through the one set-up (INTELLECT_LOG_FORMAT / INTELLECT_LOG_LEVEL).
    setup_logging()
    store_chain_options(ctx, rpc_url, deployment, keystore, as_json)


# ---- deployment ----


@command(app, deployment=False)
def deploy(
    chain: Chain,
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
) -> None:
    """Deploy all contracts in order and write the deployment file."""
    s = chain.settings()
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
    chain.emit(deployment, table, f"deployment written to {out_path}")


# ---- domains and pools ----


@command(app, "create-domain")
def create_domain(
    chain: Chain,
    name: Annotated[str, typer.Argument(help="domain name, e.g. math-rollouts")],
    parameters_uri: Annotated[str, typer.Option(help="URI of the domain's parameters")] = "",
) -> None:
    """Create a domain (federator role)."""
    c = chain.signer()
    domain_id = c.create_domain(name, parameters_uri)
    chain.emit({"domain_id": domain_id}, message=f"[green]ok[/green] domain {domain_id} created")


@command(app, "create-pool")
def create_pool(
    chain: Chain,
    domain_id: Annotated[int, typer.Option("--domain-id", help="domain the pool belongs to")],
    name: Annotated[str, typer.Option(help="pool name")],
    manager: Annotated[str | None, typer.Option(help="manager key that signs invites (default: you)")] = None,
    data_uri: Annotated[str, typer.Option(help="URI of the pool's data and hardware requirements")] = "",
    compute_limit: Annotated[int, typer.Option(help="max total compute units, 0 = unlimited")] = 0,
    start: Annotated[bool, typer.Option("--start", help="start the pool right away")] = False,
) -> None:
    """Create a compute pool; you become its creator (start, end, eject, blacklist)."""
    c = chain.signer()
    mgr = address(manager, "manager") if manager else c.address
    pool_id = c.create_pool(domain_id, mgr, name, data_uri, compute_limit)
    if start:
        c.start_pool(pool_id)
    chain.emit({"pool_id": pool_id, "started": start}, message=f"[green]ok[/green] pool {pool_id} created")


@command(app, "start-pool")
def start_pool(
    chain: Chain,
    pool_id: int,
) -> None:
    """Open a pool for joins and work."""
    chain.done(
        chain.signer().start_pool(pool_id),
        f"pool {pool_id} started",
    )


@command(app, "end-pool")
def end_pool(
    chain: Chain,
    pool_id: int,
) -> None:
    """End a pool: no more joins or work; its nodes are released."""
    chain.done(chain.signer().end_pool(pool_id), f"pool {pool_id} ended")


@command(app, keystore=False)
def pool(
    chain: Chain,
    pool_id: int,
) -> None:
    """Show a pool."""
    p = chain.reader().get_pool(pool_id)
    rows = p.model_dump()
    rows["status"] = p.status.name
    chain.emit(p, kv_table(f"pool {pool_id}", rows))


@command(app)
def invite(
    chain: Chain,
    pool_id: int,
    node: Annotated[str, typer.Argument(help="node address to invite")],
    ttl: Annotated[int, typer.Option(min=1, help="seconds until the invite expires")] = 3600,
    nonce: Annotated[int | None, typer.Option(min=0, help="invite nonce (default: random)")] = None,
) -> None:
    """Sign an invite with the manager key (your key must be the pool's manager)."""
    c = chain.signer()
    p = c.get_pool(pool_id)
    if p.manager != c.address:
        raise LedgerError(f"your key {c.address} is not pool {pool_id}'s manager {p.manager}: use --keystore")
    if c.wallet is None:  # chain.signer() refuses to build a client without a key
        raise LedgerError("no key: pass --keystore PATH or set INTELLECT_PRIVATE_KEY")
    inv = sign_invite(
        c.wallet,
        p.domain_id,
        pool_id,
        address(node, "node"),
        nonce if nonce is not None else secrets.randbits(64),
        c.timestamp() + ttl,
    )
    chain.emit(inv, kv_table(f"invite to pool {pool_id}", inv.model_dump()))


# ---- providers and nodes ----


@command(app, "whitelist-provider")
def whitelist_provider(
    chain: Chain,
    provider: str,
    remove: Annotated[bool, typer.Option("--remove", help="take the provider off the whitelist")] = False,
) -> None:
    """Whitelist a provider (federator role)."""
    c = chain.signer()
    result = c.whitelist_provider(address(provider, "provider"), not remove)
    chain.done(result, f"provider {provider} {'removed from' if remove else 'added to'} the whitelist")


@command(app, "blacklist-provider")
def blacklist_provider(
    chain: Chain,
    provider: str,
    pool_id: Annotated[
        int | None, typer.Option("--pool", help="ban only from this pool (pool manager), ejecting its nodes")
    ] = None,
    remove: Annotated[bool, typer.Option("--remove", help="lift a registry-wide ban")] = False,
) -> None:
    """Ban a provider registry-wide (federator role) or from one pool (--pool)."""
    c = chain.signer()
    addr = address(provider, "provider")
    if pool_id is not None:
        chain.done(c.blacklist_pool_provider(pool_id, addr), f"provider {addr} banned from pool {pool_id}")
    else:
        chain.done(c.blacklist_provider(addr, not remove), f"provider {addr} blacklist={not remove}")


@command(app, keystore=False)
def nodes(
    chain: Chain,
    pool_id: int,
    orchestrator: OrchestratorUrl = None,
    token: AdminToken = None,
) -> None:
    """List a pool's nodes with their on-chain status (and, with --orchestrator, their proven hardware)."""
    proven = proven_by_node(orchestrator, token) if orchestrator else {}
    c = chain.reader()
    rows: list[dict[str, Any]] = []
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
        if orchestrator:
            rows[-1]["hardware"] = proven.get(addr)
    table = Table(title=f"pool {pool_id}: {len(rows)} node(s)")
    columns = ["node", "provider", "units", "validated", "stake", "pending", "claimable"]
    for col in columns + (["proven", "when"] if orchestrator else []):
        table.add_column(col)
    for r in rows:
        amounts = (r["provider_stake"], r["pending_rewards"], r["claimable_rewards"])
        validated = "yes" if r["validated"] else "no"
        row = [r["node"], r["provider"] or "-", str(r["compute_units"]), validated]
        row += [fmt_tokens(a) for a in amounts]
        if orchestrator:
            row += proven_cells(r.get("hardware"))
        table.add_row(*row)
    chain.emit(rows, table)


@command(app)
def eject(
    chain: Chain,
    pool_id: int,
    node: str,
) -> None:
    """Eject a node from a pool (it may rejoin with a new invite)."""
    c = chain.signer()
    chain.done(c.eject_node(pool_id, address(node, "node")), f"node {node} ejected from pool {pool_id}")


@command(app, "blacklist-node")
def blacklist_node(
    chain: Chain,
    pool_id: int,
    node: str,
) -> None:
    """Ban a node from a pool for good (ejecting it if present)."""
    c = chain.signer()
    chain.done(c.blacklist_node(pool_id, address(node, "node")), f"node {node} banned from pool {pool_id}")


# ---- work ----


@command(app, keystore=False)
def work(
    chain: Chain,
    pool_id: int,
    since: Annotated[int, typer.Option(min=0, help="only work submitted at or after this unix time")] = 0,
) -> None:
    """List accepted (not invalidated) work submissions of a pool, oldest first."""
    c = chain.reader()
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
    chain.emit(records, table)


@command(app)
def invalidate(
    chain: Chain,
    pool_id: int,
    work_key: Annotated[str, typer.Argument(help="0x hex of the 32-byte work key")],
) -> None:
    """Reject work: slash the provider, drop the node's locked rewards, eject the node (validator role)."""
    c = chain.signer()
    result = c.invalidate_work(pool_id, work_key)
    ev = result.event("WorkInvalidated")
    slashed = fmt_tokens(ev.args["slashed"]) if ev else "?"
    chain.done(result, f"work {work_key} invalidated; provider slashed {slashed} tokens")


@command(app, "soft-invalidate")
def soft_invalidate(
    chain: Chain,
    pool_id: int,
    work_key: Annotated[str, typer.Argument(help="0x hex of the 32-byte work key")],
) -> None:
    """Reject work without penalty (validator role)."""
    c = chain.signer()
    chain.done(c.soft_invalidate_work(pool_id, work_key), f"work {work_key} soft-invalidated")


# ---- settings, roles, funds ----


@command(app, "set-stake-minimum")
def set_stake_minimum(
    chain: Chain,
    amount: Annotated[str, typer.Argument(help="tokens of stake per compute unit")],
) -> None:
    """Set the stake required per compute unit (admin)."""
    c = chain.signer()
    chain.done(c.set_stake_minimum(tokens(amount)), f"stake minimum set to {amount} tokens")


@command(app, "grant-validator")
def grant_validator(
    chain: Chain,
    account: str,
) -> None:
    """Grant VALIDATOR_ROLE (invalidate work, validate nodes) to an address (admin)."""
    c = chain.signer()
    chain.done(c.grant_validator(address(account)), f"{account} is now a validator")


@command(app, "grant-federator")
def grant_federator(
    chain: Chain,
    account: str,
) -> None:
    """Grant FEDERATOR_ROLE (domains, provider white/blacklists) to an address (admin)."""
    c = chain.signer()
    chain.done(c.grant_federator(address(account)), f"{account} is now a federator")


# `mint ADDR -5` would otherwise be read as an unknown option "-5": let it reach `tokens`, which names
# the problem (a negative amount).
@command(app, context_settings={"ignore_unknown_options": True})
def mint(
    chain: Chain,
    to: str,
    amount: Annotated[str, typer.Argument(help="tokens to mint")],
) -> None:
    """Mint tokens (devnets; minter role)."""
    c = chain.signer()
    chain.done(c.mint(address(to), tokens(amount)), f"minted {amount} tokens to {to}")


@command(app)
def balances(
    chain: Chain,
    accounts: Annotated[list[str] | None, typer.Argument(help="addresses (default: your key's)")] = None,
) -> None:
    """Token, ETH, stake and reward balances of addresses."""
    c = chain.reader() if accounts else chain.signer()
    targets = [address(a) for a in accounts] if accounts else [c.address]
    rows: list[dict[str, Any]] = []
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
    chain.emit(rows, table)


@command(app, "claim-rewards")
def claim_rewards(
    chain: Chain,
    node: str,
) -> None:
    """Pay a node's matured rewards to its provider (the provider's or node's key)."""
    c = chain.signer()
    result = c.claim_rewards(address(node, "node"))
    ev = result.event("RewardsClaimed")
    chain.done(result, f"claimed {fmt_tokens(ev.args['amount']) if ev else '?'} tokens")


app.add_typer(slashing_app, name="slashing")
command(app, "audit", keystore=False)(audit)
command(app, "hardware-evidence", keystore=False, deployment=False)(hardware_evidence)
command(app, "join")(node_cli.join)
command(app, "submit-work")(node_cli.submit_work)

if __name__ == "__main__":
    app()
