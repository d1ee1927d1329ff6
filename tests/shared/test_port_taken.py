"""Every service whose port is taken stops at once, exit 1, with one line naming the port and the flag
to change (issue 42.4). Before, the dashboard and the checkpoint origin and relay ended in uvicorn's own
bind error (exit 3) after their start-up, the orchestrator and discovery only after reading their
settings, keys and chain, and the worker after registering on chain. The validator and the trainer
have their own tests (tests/validator/test_cli_refusals.py, tests/trainer/test_cli.py)."""

from __future__ import annotations

import importlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner


@pytest.fixture
def taken_port() -> Iterator[int]:
    holder = socket.create_server(("127.0.0.1", 0))
    yield holder.getsockname()[1]
    holder.close()


# The console scripts' apps (pyproject's [project.scripts]), called in-process: no interpreter start-up.
APPS = {
    "intellect-orchestrator": "orchestrator.cli", "intellect-discovery": "discovery.cli",
    "intellect-dashboard": "dashboard.cli", "intellect-broadcast": "workloads.broadcast.commands",
    "intellect-worker": "worker.cli",
}  # fmt: skip
CASES = {
    "orchestrator API": ["intellect-orchestrator", "serve", "--host", "127.0.0.1", "--port", "{port}"],
    "discovery API": ["intellect-discovery", "serve", "--host", "127.0.0.1", "--port", "{port}"],
    "dashboard": ["intellect-dashboard", "serve", "--host", "127.0.0.1", "--port", "{port}"],
    "checkpoint origin": ["intellect-broadcast", "origin", "--port", "{port}", "--dir", "{tmp}/origin"],
    "checkpoint relay": ["intellect-broadcast", "relay", "--upstream", "http://127.0.0.1:9",
                         "--port", "{port}", "--dir", "{tmp}/relay"],  # fmt: skip
    # No chain at that RPC URL: the port is checked first, before any registration transaction.
    "worker API": ["intellect-worker", "start", "--api-host", "127.0.0.1", "--api-port", "{port}",
                   "--rpc-url", "http://127.0.0.1:9", "--state-dir", "{tmp}/worker", "--yes"],  # fmt: skip
}


@pytest.mark.parametrize("what", list(CASES))
def test_a_taken_port_stops_the_service_with_one_line(
    what: str, taken_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cmd = [part.format(port=taken_port, tmp=tmp_path) for part in CASES[what]]
    monkeypatch.chdir(tmp_path)  # no .env of the repository's
    app = importlib.import_module(APPS[cmd[0]]).app
    done = CliRunner().invoke(app, cmd[1:], env={"INTELLECT_HOME": str(tmp_path / "home")})
    assert done.exit_code == 1, (done.exit_code, done.output[-2000:], done.exception)
    last = done.stderr.strip().splitlines()[-1]
    flag = "--api-port" if what == "worker API" else "--port"
    assert last.startswith(f"error: cannot serve the {what} on 127.0.0.1:{taken_port}: "), done.stderr[-2000:]
    assert f"pick another {flag}" in last
