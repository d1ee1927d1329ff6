"""`intellect`: the umbrella command. `intellect devnet up` runs the whole network locally."""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from textwrap import shorten

import typer
from rich.console import Console
from rich.table import Table

from devnet import demo as demo_mod
from devnet import fire_cli, hosts_cli, network
from devnet.compose_cli import app as compose_app
from devnet.dashboard import start_dashboard, write_dashboard_env
from devnet.options import DirOption
from devnet.state import DevnetState, ManagedProcess
from devnet.task_cli import app as task_app
from intellect.cli import service_app
from intellect.links import parse_duration
from intellect.wire.admin import hardware_summary

app = service_app("Intellect: decentralized compute for reinforcement learning.")

devnet_app = typer.Typer(
    help="A local network on embedded defaults (anvil, contracts, pool).", no_args_is_help=True
)
app.add_typer(devnet_app, name="devnet")
app.add_typer(task_app, name="task")
app.add_typer(compose_app, name="compose")

console = Console()
err = Console(stderr=True, soft_wrap=True)  # one unwrapped line per error



def _summary(state: DevnetState) -> dict:
    return {
        "rpc_url": state.rpc_url,
        "chain_id": state.chain_id,
        "deployment": state.deployment_path,
        "domain_id": state.domain_id,
        "pool_id": state.pool_id,
        "accounts": {a.role: a.address for a in state.accounts},
        "processes": [
            {"name": p.name, "pid": p.pid, "alive": p.alive(), "url": p.url, "log": p.log}
            for p in state.processes
        ],
        "hosts": {h.name: h.model_dump() for h in state.world.hosts.values()} if state.world else None,
        "state_file": str(Path(state.directory) / "devnet.json"),
        "orchestrator_admin_token_file": str(Path(state.directory) / "orchestrator" / "admin-token"),
    }


def _print(state: DevnetState, as_json: bool) -> None:
    info = _summary(state)
    if as_json:
        print(json.dumps(info, indent=2))
        return
    table = Table(title="Intellect devnet", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("where")
    table.add_row("chain (anvil)", f"{info['rpc_url']}  chain id {info['chain_id']}")
    table.add_row("deployment", info["deployment"])
    table.add_row("domain / pool", f"domain {info['domain_id']}, pool {info['pool_id']} (started)")
    for role, address in info["accounts"].items():
        table.add_row(f"account: {role}", address)
    for proc in info["processes"]:
        status = "running" if proc["alive"] else "stopped"
        table.add_row(f"process: {proc['name']}", f"pid {proc['pid']} {status}  {proc['url'] or ''}")
    table.add_row("keys and pids", info["state_file"] + " (mode 0600)")
    token = Path(state.directory) / "orchestrator" / "admin-token"
    if token.exists():
        table.add_row("orchestrator admin token", f"{token} (POST /tasks with it)")
    console.print(table)
    where = _dir_flag(Path(state.directory))
    if any(proc["alive"] for proc in info["processes"]):
        console.print(f"Stop it with [bold]intellect devnet down{where}[/bold].", soft_wrap=True)
    else:
        console.print(f"Nothing is running: start it with [bold]intellect devnet up{where}[/bold].",
                      soft_wrap=True)


def _dir_flag(directory: Path) -> str:
    """` --dir X` when X is not where the commands look by default, so a printed command works as is."""
    default = Path(os.environ.get("INTELLECT_DEVNET_DIR") or ".devnet").resolve()
    return "" if directory.resolve() == default else f" --dir {shlex.quote(str(directory))}"


@devnet_app.command("up")
def up(
    directory: Path = DirOption,
    port: int | None = typer.Option(None, help="anvil port (default: a free one)"),
    workers: int | None = typer.Option(
        None, min=0, max=network.MAX_WORKERS, help="worker processes to start (default 2; 4 with --demo)"
    ),
    runtime: str = typer.Option("process", help="worker task runtime: process | docker | auto"),
    demo: bool = typer.Option(
        False, "--demo", help="run a whole RL run: trainer, validators with a quorum, a cheating worker"
    ),
    steps: int = typer.Option(40, min=1, help="--demo: trainer steps to run"),
    validators: int = typer.Option(3, min=1, max=3, help="--demo: validator processes"),
    quorum: int = typer.Option(2, min=1, max=3, help="--demo: votes needed to slash"),
    cheat: str = typer.Option(
        "forged-reward", help="--demo: what the last worker does: forged-reward | perturbed-model | "
        "inflated-units | none",
    ),
    timeout: float = typer.Option(3600, help="--demo: give up after this many seconds"),
    pipeline: int = typer.Option(
        0, help="--demo: rollouts made by node groups of this many members (2 or 3), one model stage "
        "each; --cheat then names what one member does: weights | skip | noise | other-prompt | "
        "forge-token | none (default weights)",
    ),
    hosts: bool = typer.Option(
        False, "--hosts", help="every process on a host of its own (network namespaces, root): worker 1 "
        "public, the others behind a NAT home router; `devnet partition A B` cuts a link",
    ),
    link_delay: str = typer.Option(
        "0ms", "--link-delay", help="hold every hop of a node group's ring this long one way (e.g. 50ms): a "
        "delay relay in front of each worker's p2p ports; --demo groups then keep 4 batches in flight",
    ),
    trainer_ranks: int = typer.Option(
        1, "--trainer-ranks", min=1, max=8, help="--demo: the trainer's processes, its policy sharded over "
        "them with FSDP2 under torchrun (intellect-train --nproc; gloo on the CPU)",
    ),
    backend: str = typer.Option(
        "torch", "--backend", help="--demo: the engine the workers generate with: torch | vllm (vLLM's V1 "
        "engine from its own environment, `make vllm`; with --runtime docker its image, `make images-vllm`)",
    ),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Start anvil, deploy the contracts, fund demo accounts, create a domain and a started pool,
    then Redis, discovery, the orchestrator and workers that join the pool. With --demo, also the
    trainer and validators, post the RL task and watch the reward rise and the cheater get slashed."""
    begun = time.monotonic()
    if pipeline and cheat == "forged-reward":  # the single-node default names no member's cheat
        cheat = "weights"
    try:
        delay = parse_duration(link_delay)
    except ValueError as exc:
        err.print(f"[red]--link-delay:[/red] {exc}")
        raise typer.Exit(2) from None
    if delay and not (demo and pipeline):
        err.print("[red]--link-delay[/red] holds the links of node groups: use it with --demo --pipeline N")
        raise typer.Exit(2)
    plan = demo_mod.DemoPlan(steps=steps, validators=validators, quorum=quorum, cheat=cheat, timeout=timeout,
                             pipeline=pipeline, in_flight=4 if delay else 1,
                             trainer_ranks=trainer_ranks, backend=backend)  # fmt: skip
    count = workers if workers is not None else ((2 * pipeline or 4) if demo else 2)
    state, started = _bring_up(directory, port, count, runtime, hosts, delay, plan if demo else None)
    if started is None:
        _print(state, as_json)
        if not as_json:
            console.print("A whole RL run (trainer, validators, a cheater): [bold]make devnet[/bold]")
        return
    _run_demo(state, plan, started, count, as_json, time.monotonic() - begun)


@dataclass
class _Started:
    """What `up --demo` started that the watch follows."""

    trainer: ManagedProcess
    validators: list[ManagedProcess]
    task_id: str
    stake_before: int  # the cheater's stake, read before the RL task is posted


def _demo_workers(directory: Path, plan: demo_mod.DemoPlan, count: int) -> tuple[dict[int, dict[str, str]],
                                                                                  str | None]:  # fmt: skip
    """The demo's checks, a fresh devnet folder, each worker's extra environment (the cheater's task
    environment, the backend's) and the topology the orchestrator forms (--pipeline)."""
    plan.check()
    if count < 2:
        raise demo_mod.DemoError("--demo needs at least 2 workers (one of them cheats)")
    if DevnetState.load(directory.resolve()) is not None or network.strays(directory):
        # Every demo is a new run: a new chain, a new RL task, the trainer from its base model.
        # (`intellect devnet up` without --demo resumes a devnet.)
        err.print(f"a new demo run: stopping the devnet in {directory} and removing its state")
        network.down(directory, purge=True, progress=lambda msg: None)
    worker_env: dict[int, dict[str, str]] = {}
    if plan.cheat != "none":
        worker_env[count] = {"INTELLECT_WORKER_TASK_ENV": json.dumps(plan.cheat_env())}
    for index, env in demo_mod.backend_worker_env(plan, count).items():
        worker_env[index] = {**worker_env.get(index, {}), **env}
    if plan.pipeline and count < plan.pipeline:
        raise demo_mod.DemoError(f"--pipeline {plan.pipeline} needs at least {plan.pipeline} workers")
    return worker_env, plan.topology if plan.pipeline else None


def _bring_up(directory: Path, port: int | None, count: int, runtime: str, hosts: bool, delay: float,
              plan: demo_mod.DemoPlan | None) -> tuple[DevnetState, _Started | None]:  # fmt: skip
    """The devnet, and with a demo `plan` its learning side and the posted RL task. A failure prints one
    line and stops what this call started (never a devnet that ran before it)."""
    was_running = False  # a devnet already ran here before this `up` (a failure then stops nothing)
    try:
        worker_env, groups = _demo_workers(directory, plan, count) if plan else ({}, None)
        previous = DevnetState.load(directory.resolve())
        was_running = previous is not None and any(p.alive() for p in previous.processes)
        with console.status("bringing the devnet up") as status:
            state = network.up(
                directory, port, progress=lambda msg: status.update(msg), workers=count, runtime=runtime,
                worker_env=worker_env, hosts=hosts, groups=groups, link_delay=delay,
            )  # fmt: skip
            started = _start_demo(state, plan, runtime, count, status.update) if plan else None
            write_dashboard_env(state)
        return state, started
    except Exception as exc:  # one clean line for the user; details are in the logs
        err.print(f"[red]devnet up failed:[/red] {exc}")
        if not was_running:
            # Nothing ran before this `up`: stop what it started (the state and logs stay to read).
            stopped = network.down(directory, purge=False, progress=lambda msg: None)
            if stopped:
                err.print(f"stopped what it had started: {', '.join(stopped)} (logs in {directory})")
        raise typer.Exit(1) from None


def _start_demo(state: DevnetState, plan: demo_mod.DemoPlan, runtime: str, count: int,
                say: Callable[[str], None]) -> _Started:  # fmt: skip
    say("recording the validators and the slashing quorum on chain")
    demo_mod.configure_chain(state, plan)
    trainer, broadcast, vals, task_file = demo_mod.start_learning_services(state, plan, runtime, say)
    state.processes.extend([trainer, *broadcast, *vals])
    state.save()
    say("starting the dashboard")
    state.processes.append(start_dashboard(state))
    state.save()
    stake_before = demo_mod.provider_stake(state, count) if plan.cheat != "none" else 0
    say("posting the RL task with the Python SDK")
    return _Started(trainer, vals, demo_mod.submit(state, task_file), stake_before)


def _run_demo(state: DevnetState, plan: demo_mod.DemoPlan, started: _Started, count: int, as_json: bool,
              startup: float) -> None:  # fmt: skip
    """Watch the posted RL run to its end, then its report; exit 1 if it fell short of its promise."""
    if not as_json:
        _print(state, False)
        console.print(f"RL task [bold]{started.task_id}[/bold] posted; workers pick it up at their next "
                      "heartbeat.")  # fmt: skip
        dashboard = state.process("dashboard")
        if dashboard is not None:
            console.print(f"Dashboard: [bold]{dashboard.url}[/bold] (reward curve, nodes, payouts, verdicts)")
    report = _watch_demo(state, plan, started.trainer, started.validators,
                         count if plan.cheat != "none" else None, as_json, started.stake_before)  # fmt: skip
    report.startup_seconds = startup
    dashboard = state.process("dashboard")
    report.dashboard_url = (dashboard.url or "") if dashboard else ""
    try:
        demo_mod.finish(state, started.task_id)
    except Exception as exc:  # the report matters more; say what is left behind
        err.print(f"[yellow]could not delete the RL task {started.task_id}:[/yellow] {exc}")
    demo_mod.write_curve(report, Path(state.directory) / "demo")
    if as_json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        _print_report(report)
        # the services stay up for the dashboard and a look around: say so, or they run on unnoticed
        where = _dir_flag(Path(state.directory))
        dash = f" (dashboard {report.dashboard_url})" if report.dashboard_url else ""
        console.print(f"The devnet is still running{dash}: stop it with "
                      f"[bold]intellect devnet down{where}[/bold].", soft_wrap=True)
    if report.honest_invalidations or report.honest_out_of_pool:
        err.print("[red]error:[/red] an honest node's work was voted invalid or the node left the pool "
                  "(see honest_invalidations / honest_out_of_pool in the report)")
    if (report.steps < plan.steps or (plan.cheat != "none" and not report.cheater_ejected)
            or report.honest_invalidations or report.honest_out_of_pool):
        raise typer.Exit(1)


def _watch_demo(state, plan, trainer, vals, cheater, quiet, stake_before):  # noqa: ANN001, ANN202
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("[bold]trainer"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.description}"), TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=err, disable=quiet) as bar:
        job = bar.add_task("waiting for validated rollouts", total=plan.steps)

        def on_step(step: int, reward: float | None) -> None:
            text = f"reward {reward:.3f}" if reward is not None else "waiting for validated rollouts"
            bar.update(job, completed=min(step, plan.steps), description=text)

        try:
            return demo_mod.watch(state, plan, trainer, vals, cheater, on_step, bar.console.print,
                                  stake_before)
        except demo_mod.DemoError as exc:
            err.print(f"[red]demo failed:[/red] {exc}")
            return exc.report or demo_mod.DemoReport(cheater="")


def _print_report(report: demo_mod.DemoReport) -> None:
    table = Table(title="Intellect devnet demo: the RL run", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("result")
    curve = report.curve
    table.add_row("trainer steps", str(report.steps))
    if curve:
        k = min(5, max(1, len(curve) // 2))
        table.add_row(
            "mean task reward",
            f"first {k} steps {sum(curve[:k]) / k:.3f} → last {k} steps {sum(curve[-k:]) / k:.3f} "
            f"({report.rise:+.3f})",
        )
    table.add_row("files judged / accepted", f"{report.files_judged} / {report.files_accepted}")
    table.add_row("output tokens judged", str(report.tokens_generated))
    if report.cheater:
        status = "slashed and ejected" if report.cheater_ejected else "[red]still in the pool[/red]"
        table.add_row("cheater", f"{report.cheater}: {status}")
        before, after = report.cheater_stake_before / 1e18, report.cheater_stake_after / 1e18
        table.add_row("cheater's stake", f"{before:g} → {after:g} tokens")
        for vote in report.slash_votes[:6]:
            reasons = shorten("; ".join(vote["reasons"]), width=80, placeholder=" …")  # at a word, marked
            table.add_row(f"vote by {vote['validator']}", f"{vote['tx_hash']}  ({reasons})")
    for vote in report.honest_invalidations[:6]:
        reasons = shorten("; ".join(vote["reasons"]), width=80, placeholder=" …")
        table.add_row(f"[red]honest file invalid[/red] ({vote['validator']})", f"{vote['node']}: {reasons}")
    for node, why in report.honest_out_of_pool.items():
        table.add_row("[red]honest node out of the pool[/red]", f"{node}: {why}")
    for node, figures in report.hardware.items():
        table.add_row(f"proven hardware: {node[:10]}…", hardware_summary(figures))
    for node, amount in report.claimable.items():
        locked = report.pending.get(node, 0)
        table.add_row(f"rewards: {node[:10]}…", f"{amount / 1e18:g} claimable, {locked / 1e18:g} locked")
    table.add_row("reward curve", f"{report.curve_png or report.curve_csv}")
    steps = report.steps_seconds or report.wall_seconds
    table.add_row("wall time", f"{report.startup_seconds + report.wall_seconds:.0f} s: start-up "
                  f"{report.startup_seconds:.0f} s, {report.steps} steps {steps:.0f} s, wind-down "
                  f"{report.wall_seconds - steps:.0f} s")
    console.print(table)


@devnet_app.command("down")
def down(
    directory: Path = DirOption,
    purge: bool = typer.Option(False, help="also delete the chain state, keys and logs"),
) -> None:
    """Stop every process `devnet up` started (by pid)."""
    stopped = network.down(directory, purge, progress=lambda msg: console.print(msg))
    if not stopped:
        console.print("nothing was running")


@devnet_app.command("restart")
def restart(
    names: list[str] = typer.Argument(..., help="process names as `devnet status` lists them, e.g. "
                                      "orchestrator, worker-1, redis, anvil"),
    directory: Path = DirOption,
    kill: bool = typer.Option(False, "--kill", help="SIGKILL instead of SIGTERM, as a crash would"),
    timeout: float = typer.Option(180, min=1, help="seconds to wait for each to answer again"),
    as_json: bool = typer.Option(False, "--json", help="print pid and seconds per process as JSON"),
) -> None:
    """Stop one or more devnet processes and start them again as `up` did (same command, port and
    state), waiting until each answers; `down` stops what this started."""
    import time

    from devnet.processes import RestartError
    from devnet.processes import restart as restart_process

    state = DevnetState.load(directory.resolve())
    if state is None:
        err.print(f"no devnet in {directory}: start one with `intellect devnet up`")
        raise typer.Exit(1)
    done = []
    for name in names:
        started = time.monotonic()
        try:
            proc = restart_process(state, name, kill=kill, timeout=timeout)
        except RestartError as exc:
            err.print(f"[red]restart failed:[/red] {exc}")
            raise typer.Exit(1) from None
        done.append({"name": name, "pid": proc.pid, "seconds": round(time.monotonic() - started, 2)})
        if not as_json:
            console.print(f"restarted {name}: pid {proc.pid}, answering after {done[-1]['seconds']} s")
    if as_json:
        print(json.dumps(done))


@devnet_app.command("drill")
def drill(
    services: list[str] = typer.Argument(None, help="processes to kill, in order (default: redis "
                                         "orchestrator discovery worker-1 anvil)"),
    directory: Path = DirOption,
    timeout: float = typer.Option(180, min=1, help="seconds each fault may take to recover"),
    as_json: bool = typer.Option(False, "--json", help="print the results as JSON"),
) -> None:
    """Fault drill on a running devnet: with a task in flight and its files on chain, kill -9 each
    service in turn, restart it as `up` did, and measure how long until nothing is missing."""
    from devnet.drill import DEFAULT_SERVICES, DrillError, run_drill
    from devnet.processes import RestartError

    state = DevnetState.load(directory.resolve())
    if state is None:
        err.print(f"no devnet in {directory}: start one with `intellect devnet up`")
        raise typer.Exit(1)
    unknown = [name for name in services or () if state.process(name) is None]
    if unknown:  # before the baseline: a typo would otherwise be found minutes later, as "pid 0"
        known = ", ".join(p.name for p in state.processes) or "none"
        err.print(f"error: no process named {', '.join(map(repr, unknown))} in this devnet (known: {known})",
                  markup=False)  # fmt: skip
        raise typer.Exit(2)
    say = (lambda msg: None) if as_json else (lambda msg: console.print(msg))
    try:
        results = run_drill(state, list(services or DEFAULT_SERVICES), timeout, progress=say)
    except (DrillError, RestartError) as exc:
        err.print(f"[red]drill failed:[/red] {exc}")
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps([r.as_dict() for r in results], indent=2))
    else:
        table = Table(title="Fault drill (kill -9, restart as `up` did)")
        for column in ("service", "answering (s)", "all back (s)", "lost"):
            table.add_column(column)
        for r in results:
            back = f"{r.recovered_seconds:.1f}" if r.recovered_seconds is not None else "no"
            table.add_row(r.service, f"{r.answering_seconds:.1f}", back, "; ".join(r.lost) or "nothing")
        console.print(table)
    if any(r.recovered_seconds is None for r in results):
        raise typer.Exit(1)


@devnet_app.command("status")
def status(directory: Path = DirOption, as_json: bool = typer.Option(False, "--json")) -> None:
    """Show what the devnet in --dir is made of and whether it is running."""
    state = DevnetState.load(directory.resolve())
    if state is None:
        err.print(f"no devnet in {directory}: start one with `intellect devnet up`")
        raise typer.Exit(1)
    _print(state, as_json)


@devnet_app.command("fund")
def fund(
    address: str = typer.Argument(..., help="the address to fund, e.g. a new worker's provider"),
    tokens: int = typer.Option(1000, min=0, help="pool tokens to mint to it (whole tokens)"),
    eth: float = typer.Option(10.0, min=0, help="ETH for gas to give it"),
    whitelist: bool = typer.Option(True, help="whitelist it as a provider, as the pool owner would "
                                   "(`intellect-pool whitelist-provider`): discovery refuses others' nodes"),
    directory: Path = DirOption,
) -> None:
    """Give an address of this devnet's chain ETH for gas and pool tokens for its stake, and whitelist
    it as a provider: what a contributor's new wallet needs before `intellect-worker start`."""
    from eth_utils import is_address, to_checksum_address
    from web3.types import RPCEndpoint

    from intellect.identity import Wallet
    from ledger.client import LedgerClient
    from ledger.models import ONE_TOKEN

    if not is_address(address):
        err.print(f"error: {address!r} is not an Ethereum address (0x and 40 hex digits)", markup=False)
        raise typer.Exit(2)
    state = DevnetState.load(directory.resolve())
    anvil = state.process("anvil") if state else None
    if state is None or anvil is None or not anvil.alive():
        err.print(f"no running devnet in {directory}: start one with `intellect devnet up`")
        raise typer.Exit(1)
    address = to_checksum_address(address)
    admin = LedgerClient(state.rpc_url, Path(state.deployment_path),
                         Wallet.from_key(state.account("deployer").private_key))
    wei = int(eth * 10**18)
    admin.w3.provider.make_request(RPCEndpoint("anvil_setBalance"), [address, hex(wei)])
    if tokens:
        admin.mint(address, tokens * ONE_TOKEN)
    if whitelist:
        admin.whitelist_provider(address)
    listed = ", whitelisted" if admin.get_provider(address).whitelisted else ""
    console.print(f"{address}: {eth:g} ETH for gas, {admin.balance_of(address) / ONE_TOKEN:g} tokens{listed}")


@devnet_app.command("env")
def env(directory: Path = DirOption) -> None:
    """Shell `export` lines for the running devnet in --dir: `eval "$(intellect devnet env)"`.

    RPC_URL, DEPLOYMENT, POOL_ID, ORCH (the orchestrator), DISCOVERY, INTELLECT_ADMIN_TOKEN (its admin token,
    which `intellect task` reads), VALIDATOR_KEY (the devnet's validator account, holding the on-chain
    validator role: one of anvil's public dev keys) and INTELLECT_DEVNET_DIR. For the commands of the
    README's RL loop, run next to a devnet."""
    state = DevnetState.load(directory.resolve())
    orchestrator = state.process("orchestrator") if state else None
    if state is None or orchestrator is None or orchestrator.url is None:
        err.print(f"no running devnet in {directory}: start one with `intellect devnet up`")
        raise typer.Exit(1)
    token = (Path(state.directory) / "orchestrator" / "admin-token").read_text().strip()
    discovery = state.process("discovery")
    values = {
        "INTELLECT_DEVNET_DIR": state.directory,
        "RPC_URL": state.rpc_url,
        "DEPLOYMENT": state.deployment_path,
        "POOL_ID": str(state.pool_id),
        "ORCH": orchestrator.url,
        "DISCOVERY": discovery.url if discovery is not None and discovery.url else "",
        "INTELLECT_ADMIN_TOKEN": token,
        "VALIDATOR_KEY": state.account("validator").private_key,
    }
    for name, value in values.items():
        print(f"export {name}={shlex.quote(value)}")


devnet_app.command("fire")(fire_cli.fire)
devnet_app.command("partition")(hosts_cli.partition)
devnet_app.command("heal")(hosts_cli.heal)
devnet_app.command("hosts")(hosts_cli.hosts)
