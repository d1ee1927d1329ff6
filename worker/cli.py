"""`intellect-worker`: the contributor's command line (start, check, status, wallet, balance, deregister)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Annotated, Any

import httpx
import typer
from docker.errors import DockerException
from rich.table import Table

from intellect.cli import err, out, print_json, service_app
from intellect.http_server import exit_if_port_taken
from intellect.logs import setup_logging
from intellect.net import free_port
from intellect.wire.requirements import parse_pool_requirements
from ledger.client import LedgerClient
from ledger.deploy import Deployment
from worker import __version__
from worker.chain import ChainAuthorizer, RegistrationPlan, WorkerChain, tokens, when
from worker.cli_options import (
    CliError,
    DeploymentOpt,
    DiscoveryUrl,
    JsonOut,
    PoolId,
    RpcUrl,
    StateDir,
    build_settings,
    friendly,
)
from worker.cli_wallet import wallet_app
from worker.daemon import WorkerDaemon
from worker.funding import funding_checks, provider_address
from worker.hardware import Check, blocking_failures, detect, docker_reachable, run_checks
from worker.keys import WorkerKeys, load_keys
from worker.pidfile import running_daemon, stop_daemon
from worker.runtime import RecordingRuntime, Runtime, RuntimeConfig, make_runtime, start_runtime
from worker.settings import WorkerSettings
from worker.state import StateStore

app = service_app("Intellect worker: contribute compute to a pool.", pretty_exceptions_enable=False)

app.add_typer(wallet_app, name="wallet")


def _checks_table(checks: list[Check]) -> Table:
    table = Table(title="Worker checks")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail")
    for c in checks:
        bad = "[red]FAIL[/red]" if c.blocking else "[yellow]warn[/yellow]"
        result = "[green]ok[/green]" if c.ok else bad
        table.add_row(c.name, result, c.detail)
    return table


def _chain(settings: WorkerSettings, create_keys: bool = False) -> tuple[WorkerKeys, WorkerChain]:
    keys = load_keys(settings, create=create_keys)
    return keys, WorkerChain(settings.rpc_url, settings.resolved_deployment(), keys)


def _make_runtime(kind: str, settings: WorkerSettings, node_address: str,
                  signer: Callable[[str], str] | None = None) -> Runtime:  # fmt: skip
    """`recording` only records the desired task (no execution); the others run it (worker.runtime)."""
    if kind == "recording":
        return RecordingRuntime()
    if kind not in ("auto", "docker", "process"):
        raise CliError(f"unknown --runtime {kind!r}: use auto, docker, process or recording")
    # The bridge (files ready → uploader) comes with it; a task a previous worker process left
    # running is adopted. Task data lives where `check` measured the free disk.
    return start_runtime(kind, node_address, settings.state_dir, storage_root=settings.state_dir / "data",
                         signer=signer, task_env=settings.task_env, task_network=settings.task_network,
                         p2p_seed=settings.p2p_seed, p2p_port=settings.p2p_bind_port or settings.p2p_port,
                         task_isolation=settings.task_isolation, task_software=settings.task_software,
                         task_uid=settings.task_uid, task_gid=settings.task_gid)


def _stop_left_tasks(settings: WorkerSettings, node_address: str) -> list[str]:
    """A stopped daemon leaves its task running for the next worker process to adopt; a node that
    leaves the pool has no next process, so its runs (containers or process runs) are stopped here."""
    config = RuntimeConfig(node_address=node_address, storage_root=settings.state_dir / "data",
                           state_dir=settings.state_dir / "runtime")
    kinds = ["process", "docker"] if docker_reachable(timeout=3.0) else ["process"]
    removed: list[str] = []
    for kind in kinds:
        try:
            removed += make_runtime(kind, config).stop_all()
        except (OSError, DockerException) as exc:
            err.print(f"warning: could not stop the node's {kind} tasks: {exc}")
    return removed


# ---- start ----

@app.command()
@friendly
def start(
    rpc_url: RpcUrl = None,
    deployment: DeploymentOpt = None,
    discovery_url: DiscoveryUrl = None,
    pool_id: PoolId = None,
    state_dir: StateDir = None,
    api_host: Annotated[str | None, typer.Option(help="address the worker API binds to")] = None,
    api_port: Annotated[int | None, typer.Option(help="worker API port (0: a free port)")] = None,
    advertised_ip: Annotated[str | None, typer.Option(help="IP the orchestrator reaches this API at")] = None,
    compute_units: Annotated[int | None, typer.Option(help="compute units this node offers")] = None,
    stake: Annotated[int | None, typer.Option(help="stake in token base units (default: minimum)")] = None,
    heartbeat_interval: Annotated[float | None, typer.Option(help="seconds between heartbeats")] = None,
    metadata_refresh: Annotated[float | None, typer.Option(help="seconds between discovery uploads")] = None,
    runtime: Annotated[str, typer.Option(
        help="where tasks run: auto (Docker when an engine answers, else processes), docker, process; "
        "`recording` (a test tool) only records the task and runs nothing")] = "auto",
    yes: Annotated[bool, typer.Option("--yes", "-y", help="stake without asking")] = False,
    log_level: Annotated[str, typer.Option(help="debug | info | warning")] = "info",
) -> None:
    """Check the machine, register on chain if needed, then serve the worker API and heartbeat."""
    setup_logging(log_level)
    settings = build_settings(
        rpc_url=rpc_url, deployment=deployment, discovery_url=discovery_url, pool_id=pool_id,
        state_dir=state_dir, api_host=api_host, api_port=api_port, advertised_ip=advertised_ip,
        compute_units=compute_units, stake=stake, heartbeat_interval=heartbeat_interval,
        metadata_refresh=metadata_refresh,
    )
    # Local before the chain: a taken API port stops the start before any registration transaction.
    exit_if_port_taken(settings.api_host, settings.api_port, "worker API", "--api-port")
    keys, chain = _chain(settings, create_keys=True)
    store = StateStore(settings.state_file)
    state = store.load()
    if state.node_address and state.node_address != keys.node.address:
        raise CliError(f"state in {settings.state_dir} belongs to node {state.node_address}, "
                       f"but the node key is {keys.node.address}: use another --state-dir")
    state.provider_address, state.node_address = keys.provider.address, keys.node.address

    specs = detect(settings.state_dir / "data")
    checks = run_checks(specs, chain.requirements(settings.pool_id), settings.min_disk_mb)
    failures = blocking_failures(checks)
    if failures:
        err.print(_checks_table(checks))
        raise CliError("this machine cannot join pool "
                       f"{settings.pool_id}: " + "; ".join(f"{c.name}: {c.detail}" for c in failures))

    def confirm(plan: RegistrationPlan) -> bool:
        if yes:
            return True
        what = []
        if plan.register_stake:
            amount = tokens(plan.register_stake)
            what.append(f"register provider {keys.provider.address} with {amount} tokens")
        if plan.extra_stake:
            what.append(f"add {tokens(plan.extra_stake)} tokens of stake")
        return typer.confirm("About to " + " and ".join(what) + ". Continue?", default=False)

    txs = chain.ensure_registered(settings.compute_units, settings.stake, confirm)
    state.provider_registered = state.node_added = True
    state.registration_txs += txs
    store.save(state)
    if txs:
        err.print(f"registered node {keys.node.address} ({len(txs)} transaction(s))")

    if settings.api_port == 0:
        settings = settings.model_copy(update={"api_port": free_port(settings.api_host)})
    task_runtime = _make_runtime(runtime, settings, keys.node.address, keys.node.sign_message)
    daemon = WorkerDaemon(settings, keys, chain, task_runtime, specs, store,
                          ChainAuthorizer(chain, settings.pool_id))  # fmt: skip
    err.print(f"worker {keys.node.address} serving on http://{settings.api_host}:{settings.api_port}, "
              f"pool {settings.pool_id}")
    asyncio.run(daemon.run())


# ---- check ----

@app.command()
@friendly
def check(
    rpc_url: RpcUrl = None,
    deployment: DeploymentOpt = None,
    pool_id: PoolId = None,
    state_dir: StateDir = None,
    offline: Annotated[bool, typer.Option(help="skip the pool's requirements (no chain access)")] = False,
    json_out: JsonOut = False,
) -> None:
    """Hardware and software checks; exit code 1 on a blocking problem."""
    settings = build_settings(rpc_url=rpc_url, deployment=deployment, pool_id=pool_id, state_dir=state_dir)
    specs = detect(settings.state_dir / "data")
    requirements = None
    pool_check: Check | None = None
    if not offline:
        # A named pool that cannot be read (no such pool, dead RPC) fails the check: scripts trust exit 1.
        try:
            client = LedgerClient(settings.rpc_url, Deployment.load(settings.resolved_deployment()))
            requirements = parse_pool_requirements(client.get_pool(settings.pool_id).data_uri)
            pool_check = Check("pool", True, f"pool {settings.pool_id}: requirements read")
        except Exception as exc:
            pool_check = Check("pool", False, f"pool {settings.pool_id} could not be checked: {exc}")
        address = provider_address(settings)
        if pool_check.ok and address is not None:
            try:
                money = funding_checks(client, address, settings.stake)
            except Exception as exc:
                money = [Check("provider", False, f"{address}: could not read its balances: {exc}")]
        elif pool_check.ok:
            money = [Check("provider", True, "no provider key yet: `intellect-worker wallet create` "
                           "(then fund the address it prints)", blocking=False)]
        else:
            money = []
    checks = run_checks(specs, requirements, settings.min_disk_mb)
    if pool_check is not None:
        checks.append(pool_check)
        checks.extend(money)
    failed = blocking_failures(checks)
    if json_out:
        print_json({"ok": not failed, "specs": specs.model_dump(), "checks": [c.__dict__ for c in checks]})
    else:
        out.print(_checks_table(checks))
    if failed:
        raise typer.Exit(1)


# ---- status ----

@app.command()
@friendly
def status(
    rpc_url: RpcUrl = None,
    deployment: DeploymentOpt = None,
    pool_id: PoolId = None,
    state_dir: StateDir = None,
    validator_url: Annotated[
        list[str], typer.Option("--validator-url", help="a validator's API: its verdicts on this node's work")
    ] = [],  # noqa: B006
    json_out: JsonOut = False,
) -> None:
    """The local state, what the chain says (stake, unbonding, rewards, pool membership), and the
    validators' verdicts on this node's work."""
    settings = build_settings(rpc_url=rpc_url, deployment=deployment, pool_id=pool_id, state_dir=state_dir)
    state = StateStore(settings.state_file).load()
    info: dict[str, Any] = {"local": json.loads(state.model_dump_json()),
                            "daemon_pid": running_daemon(settings.state_dir)}
    try:
        keys, chain = _chain(settings)
        info["chain"] = _chain_status(chain, settings.pool_id)
    except Exception as exc:
        info["chain"] = {"error": str(exc)}
    info["verdicts"] = {url: _verdicts(url, info["local"].get("node_address"), settings.pool_id)
                        for url in validator_url}  # fmt: skip
    if json_out:
        print_json(info)
        return
    local = info["local"]
    table = Table(title="Worker status")
    table.add_column("field")
    table.add_column("value")
    for key in ("provider_address", "node_address", "orchestrator_url", "join_tx", "updated_at"):
        table.add_row(key, str(local.get(key)))
    table.add_row("daemon", f"running (pid {info['daemon_pid']})" if info["daemon_pid"] else "not running")
    last = local.get("last_task")
    table.add_row("task", f"{last['task_id']} ({last['state']})" if last else "none")
    chain_info = info["chain"]
    if "error" in chain_info:
        table.add_row("chain", f"[red]unreadable[/red]: {chain_info['error']}")
    else:
        pool = chain_info["pool"]
        table.add_row("pool", f"{pool['id']}: member" if pool["member"]
                      else f"{pool['id']}: [yellow]not a member[/yellow] ({pool['reason']})")
        table.add_row("node registered", f"{chain_info['node_registered']} "
                      f"({chain_info['compute_units']} compute units)")
        table.add_row("stake", f"{tokens(chain_info['stake'])} tokens "
                      f"(provider registered: {chain_info['provider_registered']})")
        for entry in chain_info["unbonding"]:
            ready = "claimable now" if entry["claimable"] else f"claimable from {when(entry['release_at'])}"
            table.add_row("unbonding", f"{tokens(entry['amount'])} tokens, {ready}")
        table.add_row("rewards", f"{tokens(chain_info['rewards_claimable'])} claimable, "
                      f"{tokens(chain_info['rewards_pending'])} still locked")
    for url, found in info["verdicts"].items():
        if "error" in found:
            table.add_row(f"verdicts ({url})", f"unavailable: {found['error']}")
            continue
        counts = ", ".join(f"{k} {v}" for k, v in sorted(found["counts"].items())) or "no work judged yet"
        table.add_row(f"verdicts ({url})", counts)
        for item in found["rejected"][-3:]:
            why = "; ".join(item["reasons"])[:200]
            table.add_row(f"  {item['verdict']}", f"{item['work_key'][:18]}…: {why}")
    out.print(table)


def _verdicts(url: str, node: str | None, pool_id: int) -> dict[str, Any]:
    """This node's verdicts from one validator: counts per verdict and the latest rejections."""
    if not node:
        return {"error": "no node address in the local state yet"}
    try:
        response = httpx.get(
            url.rstrip("/") + "/verdicts", params={"pool": pool_id, "node": node, "limit": 1000}, timeout=10
        )
        response.raise_for_status()
        items = response.json()["items"]
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        return {"error": str(exc)}
    counts: dict[str, int] = {}
    for item in items:
        counts[item["verdict"]] = counts.get(item["verdict"], 0) + 1
    return {"counts": counts, "rejected": [i for i in items if i["verdict"] != "accept"]}


def _chain_status(chain: WorkerChain, pool_id: int) -> dict[str, Any]:
    membership = chain.membership(pool_id)
    preview = chain.preview_claim()
    node = chain.get_node()
    provider = chain.get_provider()
    unbonding = [{"amount": u.amount, "release_at": u.release_at,
                  "claimable": u.release_at <= preview.chain_time} for u in chain.unbonds()]
    return {
        # One view of membership: `member` and `reason` come from the same reads, never contradict.
        "pool": {"id": pool_id, "member": membership.reason is None, "reason": membership.reason},
        "node_registered": membership.node_registered,
        "compute_units": node.compute_units if node else 0,
        "provider_registered": provider.registered,
        "stake": provider.stake,
        "unbonding": sorted(unbonding, key=lambda u: u["release_at"]),
        "rewards_claimable": preview.rewards_claimable,
        "rewards_pending": preview.rewards_pending,
        "chain_time": preview.chain_time,
    }


# ---- claim ----

@app.command()
@friendly
def claim(
    rpc_url: RpcUrl = None, deployment: DeploymentOpt = None, state_dir: StateDir = None,
    json_out: JsonOut = False,
) -> None:
    """Claim matured rewards (minted to the provider) and stake whose unbonding has ended."""
    settings = build_settings(rpc_url=rpc_url, deployment=deployment, state_dir=state_dir)
    _, chain = _chain(settings)
    results = chain.claim()
    if json_out:
        print_json([r.__dict__ for r in results])
        return
    table = Table(title=f"Claimed for provider {chain.provider}")
    for col in ("what", "tokens", "tx", "gas"):
        table.add_column(col)
    for r in results:
        table.add_row(r.kind, tokens(r.amount), r.tx_hash, str(r.gas_used))
    out.print(table)


# ---- balance ----

@app.command()
@friendly
def balance(
    rpc_url: RpcUrl = None, deployment: DeploymentOpt = None, state_dir: StateDir = None,
    json_out: JsonOut = False,
) -> None:
    """ETH (for gas) and token balances of the provider and node keys, and the provider's stake."""
    settings = build_settings(rpc_url=rpc_url, deployment=deployment, state_dir=state_dir)
    keys, chain = _chain(settings)
    balances = chain.balances()
    provider = chain.get_provider()
    rows = [
        {"key": role, "address": getattr(keys, role).address, "eth_wei": b["eth_wei"], "tokens": b["tokens"]}
        for role, b in balances.items()
    ]
    if json_out:
        print_json({"balances": rows, "stake": provider.stake, "registered": provider.registered})
        return
    table = Table(title="Balances")
    for col in ("key", "address", "ETH", "tokens"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["key"], r["address"], f"{r['eth_wei'] / 10**18:,.6f}", tokens(r["tokens"]))
    out.print(table)
    out.print(f"stake: {tokens(provider.stake)} tokens (registered: {provider.registered})")


# ---- deregister ----

@app.command()
@friendly
def deregister(
    rpc_url: RpcUrl = None,
    deployment: DeploymentOpt = None,
    pool_id: PoolId = None,
    state_dir: StateDir = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
    stop_timeout: Annotated[float, typer.Option(help="seconds to wait for the daemon to stop")] = 30.0,
    json_out: JsonOut = False,
) -> None:
    """Stop the local daemon, leave the pool, remove the node and start unbonding the stake (claimable
    with `claim` once the unbonding period has passed)."""
    settings = build_settings(rpc_url=rpc_url, deployment=deployment, pool_id=pool_id, state_dir=state_dir)
    keys, chain = _chain(settings)
    if not yes and not typer.confirm(f"Remove node {keys.node.address} and unbond the stake?", default=False):
        raise typer.Exit(1)
    pid = running_daemon(settings.state_dir)
    if pid is not None:
        # A daemon left running would keep heartbeating and uploading for a node that no longer exists.
        if not stop_daemon(pid, timeout=stop_timeout):
            raise CliError(f"the worker daemon (pid {pid}) is still running: stop it (`kill {pid}`) "
                           "and run deregister again; nothing was changed on chain")
        err.print(f"stopped the worker daemon (pid {pid})")
    removed = _stop_left_tasks(settings, keys.node.address)
    if removed:
        err.print(f"stopped the node's task: {', '.join(removed)}")
    txs = chain.deregister(settings.pool_id)
    store = StateStore(settings.state_file)
    state = store.load()
    state.pool_joined = False
    state.orchestrator_url = None
    state.node_added = False
    state.provider_registered = chain.get_provider().registered
    store.save(state)
    unbonds = sorted(chain.unbonds(), key=lambda u: u.release_at)
    if json_out:
        print_json({"node": keys.node.address, "provider": keys.provider.address, "transactions": txs,
                    "daemon_stopped": pid, "tasks_stopped": removed,
                    "unbonding": [u.model_dump() for u in unbonds]})
        return
    out.print(f"deregistered node {keys.node.address}: {len(txs)} transaction(s)")
    for tx in txs:
        out.print(f"  {tx}")
    for u in unbonds:
        out.print(f"{tokens(u.amount)} tokens of stake claimable from {when(u.release_at)} "
                      "with `intellect-worker claim`")


@app.command()
def version() -> None:
    """Print the worker version."""
    out.print(__version__)


if __name__ == "__main__":
    app()
