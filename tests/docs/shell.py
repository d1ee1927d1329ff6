"""Run the docs' shell blocks as written: `bash -e` in a scratch folder that looks like the project's
(`.venv` linked), with `.venv/bin` on PATH, free ports for the port variables a block defaults
(`${TRAINER_PORT:-8092}` and the like, reserved until the document's blocks are done), and a time
limit. Whatever a block leaves running in the
background is killed with its process group afterwards, pass or fail."""

from __future__ import annotations

import os
import random
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sybil import Example

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
BLOCK_TIMEOUT = 900.0
PORT_VARIABLES = ("VALIDATOR_PORT", "TRAINER_PORT", "ORIGIN_PORT", "RELAY_PORT")


@dataclass
class Shell:
    """Where and with what environment a document's shell blocks run."""

    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    reservations: list[socket.socket] = field(default_factory=list)

    def release(self) -> None:
        """Give the reserved ports back (the document's blocks are done)."""
        for sock in self.reservations:
            sock.close()
        self.reservations.clear()

    def run(self, script: str, timeout: float = BLOCK_TIMEOUT) -> subprocess.CompletedProcess[str]:
        process = subprocess.Popen(
            ["bash", "-e", "-c", script], cwd=self.cwd, env=self.env, text=True, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            output = ""
            process.returncode = -1
        finally:
            _kill_group(process.pid)
        return subprocess.CompletedProcess(process.args, process.returncode, output, "")

    def devnet_env(self) -> dict[str, str]:
        """What `intellect devnet env` exports for the devnet in this folder."""
        result = self.run(".venv/bin/intellect devnet env", timeout=60)
        assert result.returncode == 0, result.stdout
        pairs = (line.removeprefix("export ").split("=", 1) for line in result.stdout.splitlines())
        return {name: shlex.split(value)[0] for name, value in pairs}


def _kill_group(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        time.sleep(1.0)


def reserve_port() -> socket.socket:
    """A port below the kernel's ephemeral range, held by a bound (not listening) socket until the
    caller closes it.

    Below the ephemeral range: the OS never hands such a port out as some process's outgoing source
    port (that once made the README's validator fail to bind, seen in CI). Held until use: a port only
    probed as free could be taken by anyone between the probe and the block's service binding it
    (another document's block under pytest-xdist, say). The holder sets SO_REUSEADDR and never
    listens, so the block's service (which binds with SO_REUSEADDR, as uvicorn and
    `socket.create_server` do) can still bind and listen on it, while any other bind is refused."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        port = random.randrange(20_000, min(low, 32_000))
        # A probe without SO_REUSEADDR is refused while anyone holds the port, another reservation too
        # (two SO_REUSEADDR sockets that do not listen may share a port).
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue
        return sock
    raise RuntimeError("no free port below the ephemeral range")


def new_shell(root: Path) -> Shell:
    root.mkdir(parents=True, exist_ok=True)
    link = root / ".venv"
    if not link.exists():
        link.symlink_to(REPO / ".venv")
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', os.defpath)}"
    reservations = [reserve_port() for _ in PORT_VARIABLES]
    ports = [str(sock.getsockname()[1]) for sock in reservations]
    env.update(dict(zip(PORT_VARIABLES, ports, strict=True)))
    return Shell(root, env, reservations)


def run_shell_block(example: Example) -> str | None:
    """Sybil evaluator for ```bash blocks: the document's `doc_shell` runs it; a failure shows its output."""
    shell: Shell = example.namespace.get("doc_shell") or example.namespace["doc_devnet"]
    result = shell.run(str(example.parsed))
    if result.returncode != 0:
        return f"the block at line {example.line} exited {result.returncode}:\n{result.stdout[-6000:]}"
    return None


def run_readme_python(example: Example) -> None:
    """Sybil evaluator for the README's ```python blocks: run in the document's namespace, where `url`
    and `token` are the devnet's orchestrator and admin token, as the README says they are."""
    namespace = example.namespace
    shell: Shell = namespace["doc_devnet"]
    if "url" not in namespace:
        values = shell.devnet_env()
        namespace["url"], namespace["token"] = values["ORCH"], values["INTELLECT_ADMIN_TOKEN"]
    code = compile(str(example.parsed), f"{example.path}:{example.line}", "exec")
    exec(code, namespace)  # noqa: S102 - the README's own example, run as written


@pytest.fixture(scope="module")
def doc_shell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    """A scratch folder for one document's blocks (no devnet)."""
    shell = new_shell(tmp_path_factory.mktemp("doc"))
    yield shell
    shell.release()


@pytest.fixture(scope="module")
def doc_devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    """A running devnet (`intellect devnet up`: chain, orchestrator, two workers) in the scratch folder,
    as the README's "Using the devnet" and "The RL loop" expect; stopped (by pid) afterwards."""
    shell = new_shell(tmp_path_factory.mktemp("readme"))
    up = shell.run(".venv/bin/intellect devnet up", timeout=300)
    try:
        assert up.returncode == 0, up.stdout[-4000:]
        yield shell
    finally:
        down = shell.run(".venv/bin/intellect devnet down", timeout=120)
        shell.release()
        assert down.returncode == 0, down.stdout[-2000:]
