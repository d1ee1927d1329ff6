"""The dashboard next to a devnet: its settings written where `intellect-dashboard serve` looks, and
the demo's own dashboard process.

`<devnet>/dashboard.env` holds the `INTELLECT_DASHBOARD_*` values of the running devnet (orchestrator
and its admin token file, the first validator, the trainer, the chain); DashboardSettings reads
`.devnet/dashboard.env` before `.env`, so next to a devnet `intellect-dashboard serve` needs no flag.
"""

from __future__ import annotations

from pathlib import Path

from devnet.placement import Placement
from devnet.processes import BIN, base_env, spawn, wait_healthy
from devnet.state import DevnetState, ManagedProcess
from intellect.net import stable_port

ENV_FILE = "dashboard.env"


def dashboard_env(state: DevnetState) -> dict[str, str]:
    token_file = Path(state.directory) / "orchestrator" / "admin-token"
    values = {
        "INTELLECT_DASHBOARD_RPC_URL": state.rpc_url,
        "INTELLECT_DASHBOARD_DEPLOYMENT": state.deployment_path,
        "INTELLECT_DASHBOARD_POOL_ID": str(state.pool_id),
        "INTELLECT_DASHBOARD_ORCHESTRATOR_TOKEN_FILE": str(token_file),
    }
    for name, setting in (("orchestrator", "ORCHESTRATOR_URL"), ("validator", "VALIDATOR_URL"),
                          ("trainer", "TRAINER_URL")):  # fmt: skip
        proc = state.process(name)
        if proc is not None and proc.url:
            values[f"INTELLECT_DASHBOARD_{setting}"] = proc.url
    if state.process("trainer") is not None:  # the demo's trainer: its manifests outlive it
        values["INTELLECT_DASHBOARD_TRAINER_DIR"] = str(Path(state.directory) / "trainer")
    return values


def write_dashboard_env(state: DevnetState) -> Path:
    path = Path(state.directory) / ENV_FILE
    lines = [f"{name}={value}" for name, value in dashboard_env(state).items()]
    path.write_text("# written by `intellect devnet up`: the dashboard's settings for this devnet\n"
                    + "\n".join(lines) + "\n")
    return path


def start_dashboard(state: DevnetState) -> ManagedProcess:
    """`intellect-dashboard serve` on a free port, configured for this devnet; waits until it answers."""
    directory = Path(state.directory)
    port = stable_port()
    where = Placement.of(state)
    host = where.host("dash")
    own = {"INTELLECT_DASHBOARD_PORT": str(port), "INTELLECT_DASHBOARD_HOST": where.bind(host)}
    env = base_env(directory) | dashboard_env(state) | own
    proc = spawn("dashboard", where.wrap(host, [str(BIN / "intellect-dashboard"), "serve"]), env, directory,
                 f"http://{where.address(host)}:{port}")  # fmt: skip
    where.save(state)
    wait_healthy(proc, timeout=60)
    return proc
