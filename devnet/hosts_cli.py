"""`intellect devnet partition A B`, `heal A B` and `hosts`: the links of a devnet started with
`up --hosts` (devnet/hosts.py). Host names as `intellect devnet hosts` lists them: chain, redis,
discovery, storage, orch, w1, w2, … and with --demo trainer, relay, v1, v2, …, dash."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from devnet.hosts import HostsError, World
from devnet.options import DirOption, HostA, HostB
from devnet.placement import world_exists
from devnet.state import DevnetState

console = Console()
err = Console(stderr=True)


def _world(directory: Path) -> World:
    state = DevnetState.load(directory.resolve())
    if state is None:
        err.print(f"no devnet in {directory}: start one with `intellect devnet up --hosts`")
        raise typer.Exit(1)
    if state.world is None:
        err.print(f"the devnet in {directory} runs on loopback: links exist only with `up --hosts`")
        raise typer.Exit(1)
    if not world_exists(directory.resolve()):
        err.print(f"the hosts of the devnet in {directory} are gone: `intellect devnet up --hosts` again")
        raise typer.Exit(1)
    return World.from_record(state.world)


def _cut(directory: Path, a: str, b: str, heal: bool) -> None:
    world = _world(directory)
    try:
        (world.heal if heal else world.partition)(a, b)
    except HostsError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    console.print(f"{'healed' if heal else 'cut'} the link {a} ↔ {b}")


def partition(a: str = HostA, b: str = HostB, directory: Path = DirOption) -> None:
    """Cut the link between two hosts, both ways (connections in flight stall, new ones time out)."""
    _cut(directory, a, b, heal=False)


def heal(a: str = HostA, b: str = HostB, directory: Path = DirOption) -> None:
    """Restore a link `partition` cut."""
    _cut(directory, a, b, heal=True)


def hosts(
    directory: Path = DirOption,
    as_json: bool = typer.Option(False, "--json", help="print the hosts as JSON"),
) -> None:
    """The hosts of a devnet started with `up --hosts`: address, the address others see, NAT."""
    world = _world(directory)
    rows = [h.model_dump() for h in world.hosts.values()]
    if as_json:
        print(json.dumps({"world": world.index, "hosts": rows}, indent=2))
        return
    table = Table(title=f"hosts of world {world.index} (namespaces ix{world.index}-*)")
    for column in ("host", "address", "seen as", "behind"):
        table.add_column(column)
    for h in world.hosts.values():
        table.add_row(h.name, h.address, h.public_address, f"NAT ({h.home})" if h.home else "public")
    console.print(table)
