"""A world of separate hosts on one machine: one Linux network namespace per host (issue 21).

Every process of a multi-host devnet runs in its own namespace with its own address, so nothing can
reach anything by loopback. The layout, all of it inside namespaces this module creates:

    ix<N>-core      the "internet": a bridge every public host and home router is plugged into,
                    10.88.<N>.0/24; the devnet command itself gets a leg on it (10.88.<N>.254, a veth
                    whose peer lives in the core namespace, so it disappears with the world)
    ix<N>-<host>    a public host: 10.88.<N>.<k> on the bridge
    ix<N>-<home>    a home router: a public leg on the bridge and a LAN bridge 10.<90+h>.<N>.1/24;
                    nftables masquerades the LAN out and drops every new connection coming in (a
                    contributor's router with no port forwarded: no inbound path at all)
    ix<N>-<host>    a host behind a home: 10.<90+h>.<N>.<k>, default route via its router

Links are cut inside the endpoints' own namespaces (`partition`/`heal`): an nftables table of ours,
`inet intellect_cut`, drops traffic to and from a set of peer addresses; never the machine's ruleset
(Docker keeps its own tables there). Destroying the world kills every process left in its namespaces
and deletes them; veths and nft tables go with them, so a world can be cleaned up from its number
alone, also after the command that made it was killed with -9 (`World.attach(N).destroy()`).

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 and nftables; `require_privileges` says in one
line what is missing. There is no netem here: links are up or cut, not slowed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field

from pydantic import BaseModel

PREFIX = "ix"
MAX_WORLDS = 200
MAX_HOMES = 9
_NAME = re.compile(r"^[a-z][a-z0-9]{0,9}$")  # host names: short enough for interface names


class HostsError(Exception):
    """The multi-host world could not be made or changed; the message says what to fix."""


def _run(*argv: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise HostsError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def require_privileges() -> None:
    """One line naming what is missing when this machine cannot make namespaces."""
    if os.geteuid() != 0:
        raise HostsError("a multi-host world needs root (network namespaces, veths and nftables)")
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            package = "iproute2" if tool == "ip" else "nftables"
            raise HostsError(f"`{tool}` is missing: install {package} (`make hosts`, or apt-get install "
                             f"{package})")


def namespaces() -> list[str]:
    out = _run("ip", "netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


class Host(BaseModel):
    name: str
    netns: str
    address: str  # its own address (private behind a home)
    home: str | None = None  # the home router it sits behind, None when public
    public_address: str = ""  # the address others see its connections come from

    def argv(self, command: list[str]) -> list[str]:
        """`command` run inside this host (the pid of the Popen is the command's own: `ip` execs)."""
        return ["ip", "netns", "exec", self.netns, *command]


class WorldRecord(BaseModel):
    """What a devnet keeps of its world (devnet.json) to cut links and remove it later."""

    index: int
    hosts: dict[str, Host] = {}
    homes: dict[str, int] = {}


@dataclass
class World:
    index: int
    hosts: dict[str, Host] = field(default_factory=dict)
    homes: dict[str, int] = field(default_factory=dict)  # home router name -> its LAN number

    @property
    def core(self) -> str:
        return f"{PREFIX}{self.index}-core"

    @property
    def gateway(self) -> str:
        """The devnet command's own address on the world's internet."""
        return f"10.88.{self.index}.254"

    @property
    def leg(self) -> str:
        return f"{PREFIX}{self.index}r"

    @classmethod
    def create(cls) -> World:
        """Claim a free world number (creating its core namespace is the atomic claim) and wire it."""
        require_privileges()
        for index in range(1, MAX_WORLDS + 1):
            name = f"{PREFIX}{index}-core"
            if _run("ip", "netns", "add", name, check=False).returncode == 0:
                world = cls(index)
                try:
                    world._wire_core()
                except HostsError:
                    world.destroy()
                    raise
                return world
        raise HostsError(f"all {MAX_WORLDS} world numbers are taken: `intellect devnet down` old worlds")

    @classmethod
    def attach(cls, index: int) -> World:
        """The world numbered `index` as it exists now (for destroying it after its maker died)."""
        return cls(index)

    def record(self) -> WorldRecord:
        return WorldRecord(index=self.index, hosts=dict(self.hosts), homes=dict(self.homes))

    @classmethod
    def from_record(cls, record: WorldRecord) -> World:
        return cls(record.index, dict(record.hosts), dict(record.homes))

    def _in(self, netns: str, *argv: str) -> None:
        """`ip <argv>` inside `netns`."""
        _run("ip", "-n", netns, *argv)

    def _nft(self, netns: str, script: str) -> None:
        _run("ip", "netns", "exec", netns, "nft", "-f", "-", stdin=script)

    def _wire_core(self) -> None:
        core = self.core
        self._in(core, "link", "set", "lo", "up")
        self._in(core, "link", "add", "br0", "type", "bridge")
        self._in(core, "link", "set", "br0", "up")
        # the devnet command's leg: its peer sits in the core namespace, so deleting the core deletes it
        # (asynchronously: `destroy` deletes it first, and a leg left by a core deleted by hand goes here)
        leg = self.leg
        _run("ip", "link", "del", leg, check=False)
        _run("ip", "link", "add", leg, "type", "veth", "peer", "name", "up0", "netns", core)
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", leg)
        _run("ip", "link", "set", leg, "up")
        self._in(core, "link", "set", "up0", "master", "br0")
        self._in(core, "link", "set", "up0", "up")

    def _new_namespace(self, name: str) -> str:
        if not _NAME.match(name):
            raise HostsError(f"host name {name!r}: lowercase letters and digits, at most 10, a letter first")
        if name in self.hosts or name in self.homes or name == "core":
            raise HostsError(f"host name {name!r} is taken in world {self.index}")
        netns = f"{PREFIX}{self.index}-{name}"
        _run("ip", "netns", "add", netns)
        self._in(netns, "link", "set", "lo", "up")
        return netns

    def _plug(self, netns: str, bridge_ns: str, bridge: str, address: str, tag: str) -> None:
        """A veth from `netns` (eth0, `address`) into `bridge` of `bridge_ns`."""
        port = f"p{tag}"[:15]
        _run("ip", "-n", bridge_ns, "link", "add", port, "type", "veth", "peer", "name", "eth0",
             "netns", netns)  # fmt: skip
        self._in(bridge_ns, "link", "set", port, "master", bridge)
        self._in(bridge_ns, "link", "set", port, "up")
        self._in(netns, "addr", "add", address, "dev", "eth0")
        self._in(netns, "link", "set", "eth0", "up")

    def _next_public(self) -> str:
        taken = {h.address for h in self.hosts.values() if h.home is None}
        taken |= {f"10.88.{self.index}.{2 + n}" for n in self.homes.values()}
        for k in range(10, 250):
            candidate = f"10.88.{self.index}.{k}"
            if candidate not in taken:
                return candidate
        raise HostsError("no public address left in this world")

    def add_host(self, name: str, behind: str | None = None) -> Host:
        """A host on the world's internet, or on the LAN of home router `behind`."""
        netns = self._new_namespace(name)
        if behind is None:
            address = self._next_public()
            self._plug(netns, self.core, "br0", f"{address}/24", name)
            host = Host(name=name, netns=netns, address=address, public_address=address)
        else:
            if behind not in self.homes:
                raise HostsError(f"no home router {behind!r} in world {self.index}: add it first")
            lan = self.homes[behind]
            k = 10 + sum(1 for h in self.hosts.values() if h.home == behind)
            address = f"10.{90 + lan}.{self.index}.{k}"
            router = f"{PREFIX}{self.index}-{behind}"
            self._plug(netns, router, "lan", f"{address}/24", name)
            self._in(netns, "route", "add", "default", "via", f"10.{90 + lan}.{self.index}.1")
            host = Host(name=name, netns=netns, address=address, home=behind,
                        public_address=f"10.88.{self.index}.{2 + lan}")  # fmt: skip
        self.hosts[name] = host
        return host

    def add_home(self, name: str) -> str:
        """A home router: masquerades its LAN out, lets nothing in. Returns its public address."""
        if len(self.homes) >= MAX_HOMES:
            raise HostsError(f"at most {MAX_HOMES} home routers in one world")
        lan = len(self.homes)
        netns = self._new_namespace(name)
        public = f"10.88.{self.index}.{2 + lan}"
        self._plug(netns, self.core, "br0", f"{public}/24", name)
        self._in(netns, "link", "add", "lan", "type", "bridge")
        self._in(netns, "addr", "add", f"10.{90 + lan}.{self.index}.1/24", "dev", "lan")
        self._in(netns, "link", "set", "lan", "up")
        _run("ip", "netns", "exec", netns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        self._nft(netns, """
table ip intellect_nat {
  chain masq { type nat hook postrouting priority srcnat; oifname "eth0" masquerade; }
  chain guard {
    type filter hook forward priority filter; policy drop;
    iifname "lan" accept
    ct state established,related accept
  }
}
""")  # fmt: skip
        self.homes[name] = lan
        return public

    def _cut_table(self, netns: str) -> None:
        self._nft(netns, """
table inet intellect_cut {
  set peers { type ipv4_addr; }
  chain to_peers { type filter hook output priority filter; ip daddr @peers drop; }
  chain from_peers { type filter hook input priority filter; ip saddr @peers drop; }
}
""")  # an existing table is kept: `table` adds to it, the set keeps its elements

    def _seen_from(self, viewer: Host, other: Host) -> str | None:
        """The address `viewer` reaches or hears `other` at; None when only `other`'s side can tell
        (it sits behind a home `viewer` is not in: its traffic arrives as its router's)."""
        if other.home is None or other.home == viewer.home:
            return other.address
        return None

    def _cut(self, a: str, b: str, op: str) -> None:
        hosts = [self._host(a), self._host(b)]
        done = False
        for viewer, other in (hosts, hosts[::-1]):
            address = self._seen_from(viewer, other)
            if address is None:
                continue
            self._cut_table(viewer.netns)
            verb = "add" if op == "cut" else "delete"
            _run("ip", "netns", "exec", viewer.netns, "nft", verb, "element", "inet", "intellect_cut",
                 "peers", f"{{ {address} }}", check=op == "cut")  # fmt: skip
            done = True
        if not done:
            raise HostsError(f"{a} and {b} sit behind different homes: there is no link between them to cut")

    def partition(self, a: str, b: str) -> None:
        """Cut the link between hosts `a` and `b`, both ways (connections in flight stall)."""
        self._cut(a, b, "cut")

    def heal(self, a: str, b: str) -> None:
        self._cut(a, b, "heal")

    def _host(self, name: str) -> Host:
        if name not in self.hosts:
            known = ", ".join(sorted(self.hosts))
            raise HostsError(f"no host {name!r} in world {self.index} (hosts: {known})")
        return self.hosts[name]

    def own_namespaces(self) -> list[str]:
        mine = f"{PREFIX}{self.index}-"
        return [n for n in namespaces() if n.startswith(mine)]

    def destroy(self, grace: float = 3.0) -> list[str]:
        """Stop every process in the world's namespaces (TERM, then KILL after `grace`), delete the
        namespaces (their veths and nft tables go with them). Returns the namespaces removed."""
        names = self.own_namespaces()
        pids = {int(p) for n in names for p in _run("ip", "netns", "pids", n, check=False).stdout.split()}
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in list(pids):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pids.discard(pid)
            deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 2.0)
            while pids and time.monotonic() < deadline:
                pids = {p for p in pids if _alive(p)}
                time.sleep(0.05)
        _run("ip", "link", "del", self.leg, check=False)
        for n in sorted(names, key=lambda n: n.endswith("-core")):  # hosts first, the core last
            _run("ip", "netns", "del", n, check=False)
        return names


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as gone: reap it
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True
