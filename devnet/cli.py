"""`intellect`: the umbrella command. `intellect devnet up` runs the whole network locally."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from devnet import network
from devnet.state import DevnetState

app = typer.Typer(help="Intellect: decentralized compute for reinforcement learning.", no_args_is_help=True)
devnet_app = typer.Typer(
    help="A local network on embedded defaults (anvil, contracts, pool).", no_args_is_help=True
)
app.add_typer(devnet_app, name="devnet")

console = Console()
err = Console(stderr=True)

DirOption = typer.Option(
    Path(".devnet"),
    "--dir",
    envvar="INTELLECT_DEVNET_DIR",
    help="where the devnet keeps its chain state, logs and devnet.json",
)


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
    console.print("Stop it with [bold]intellect devnet down[/bold].")


@devnet_app.command("up")
def up(
    directory: Path = DirOption,
    port: int | None = typer.Option(None, help="anvil port (default: a free one)"),
    workers: int = typer.Option(2, min=0, max=3, help="worker processes to start (0-3)"),
    runtime: str = typer.Option("process", help="worker task runtime: process | docker | auto"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Start anvil, deploy the contracts, fund demo accounts, create a domain and a started pool,
    then Redis, discovery, the orchestrator and workers that join the pool."""
    try:
        with console.status("bringing the devnet up") as status:
            state = network.up(
                directory, port, progress=lambda msg: status.update(msg), workers=workers, runtime=runtime
            )
    except Exception as exc:  # one clean line for the user; details are in the logs
        err.print(f"[red]devnet up failed:[/red] {exc}")
        raise typer.Exit(1) from None
    _print(state, as_json)


@devnet_app.command("down")
def down(
    directory: Path = DirOption,
    purge: bool = typer.Option(False, help="also delete the chain state, keys and logs"),
) -> None:
    """Stop every process `devnet up` started (by pid)."""
    stopped = network.down(directory, purge, progress=lambda msg: console.print(msg))
    if not stopped:
        console.print("nothing was running")


@devnet_app.command("status")
def status(directory: Path = DirOption, as_json: bool = typer.Option(False, "--json")) -> None:
    """Show what the devnet in --dir is made of and whether it is running."""
    state = DevnetState.load(directory.resolve())
    if state is None:
        err.print(f"no devnet in {directory}: start one with `intellect devnet up`")
        raise typer.Exit(1)
    _print(state, as_json)
