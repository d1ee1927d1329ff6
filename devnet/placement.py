"""Where each devnet process runs: this machine's loopback (the default), or a host of its own in a
multi-host world (`intellect devnet up --hosts`, devnet/hosts.py), where it binds every address of
its namespace and is reached at the host's address. Workers after the first sit behind one home
router (NAT, no inbound path): their invites cannot be pushed and reach them through discovery."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from devnet.hosts import Host, World
from devnet.state import DevnetState

MARKER = "world.json"  # written as soon as the world exists: `down` finds it even if `up` was killed
HOME = "home"


@dataclass
class Placement:
    world: World | None = None

    @classmethod
    def of(cls, state: DevnetState) -> Placement:
        """The placement of a running devnet (loopback unless it was started with --hosts)."""
        return cls(World.from_record(state.world) if state.world else None)

    def save(self, state: DevnetState) -> None:
        """Record the hosts made since (`devnet hosts`, `partition` name them from the state)."""
        if self.world is not None:
            state.world = self.world.record()
            state.save()

    @classmethod
    def create(cls, directory: Path) -> Placement:
        world = World.create()
        (directory / MARKER).write_text(json.dumps({"index": world.index}))
        return cls(world)

    def host(self, name: str, nat: bool = False) -> Host | None:
        """The host `name` (made on first use); None on loopback."""
        if self.world is None:
            return None
        if name in self.world.hosts:
            return self.world.hosts[name]
        if nat and HOME not in self.world.homes:
            self.world.add_home(HOME)
        return self.world.add_host(name, behind=HOME if nat else None)

    @staticmethod
    def bind(host: Host | None) -> str:
        return "0.0.0.0" if host else "127.0.0.1"

    @staticmethod
    def address(host: Host | None) -> str:
        return host.address if host else "127.0.0.1"

    @staticmethod
    def wrap(host: Host | None, argv: list[str]) -> list[str]:
        return host.argv(argv) if host else argv

    @staticmethod
    def reachable(host: Host | None) -> bool:
        """Whether this (the devnet command's) machine can call it: not behind the home router."""
        return host is None or host.home is None


def _marked(directory: Path) -> int | None:
    try:
        return int(json.loads((directory / MARKER).read_text())["index"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def world_exists(directory: Path) -> bool:
    index = _marked(directory)
    return index is not None and bool(World.attach(index).own_namespaces())


def destroy_world(directory: Path) -> list[str]:
    """Remove the devnet's world. The marker, written when the world was made and deleted here, is
    what says the world is this devnet's: also after `up` was killed, and never a later world that
    reused the number."""
    index = _marked(directory)
    removed = World.attach(index).destroy() if index is not None else []
    (directory / MARKER).unlink(missing_ok=True)
    return removed
