"""`intellect compose …`: the two steps docker-compose.yml needs from the project.

- `env`: write the compose env file: a fresh chain mnemonic, every role's key derived from it, and
  the ports. Nothing secret is committed; `make compose-env` runs this once.
- `bootstrap`: the compose `deploy` job: contracts, funded accounts, a domain and a started pool on
  the anvil service (idempotent: a restarted job changes nothing).
"""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.console import Console

from devnet.bootstrap import ROLES, bootstrap, new_mnemonic, role_keys
from intellect.identity import Wallet
from intellect.net import free_port

app = typer.Typer(help="Helpers for docker-compose.yml (env file, chain bootstrap).", no_args_is_help=True)
err = Console(stderr=True, soft_wrap=True)

PORTS = {
    "ANVIL_PORT": 8545,
    "REDIS_PORT": 6379,
    "DISCOVERY_PORT": 8089,
    "ORCHESTRATOR_PORT": 8090,
    "VALIDATOR_PORT": 8091,
    "TRAINER_PORT": 8092,
    "BROADCAST_PORT": 8093,
    "DASHBOARD_PORT": 8095,
    "WORKER_1_PORT": 8101,
    "WORKER_2_PORT": 8102,
}
POOL_ID = 1  # the first pool of the fresh chain `bootstrap` sets up


def service_env(ports: dict[str, int]) -> list[str]:
    """Each service's own settings (its INTELLECT_<SERVICE>_* prefix), all on loopback."""
    rpc = f"http://127.0.0.1:{ports['ANVIL_PORT']}"
    discovery = f"http://127.0.0.1:{ports['DISCOVERY_PORT']}"
    orchestrator = f"http://127.0.0.1:{ports['ORCHESTRATOR_PORT']}"
    return [
        f"INTELLECT_RPC_URL={rpc}",
        f"INTELLECT_DISCOVERY_PORT={ports['DISCOVERY_PORT']}",
        f"INTELLECT_DISCOVERY_REDIS_URL=redis://127.0.0.1:{ports['REDIS_PORT']}/0",
        f"INTELLECT_DISCOVERY_RPC_URL={rpc}",
        f"INTELLECT_DISCOVERY_POOL_ID={POOL_ID}",
        f"INTELLECT_ORCH_PORT={ports['ORCHESTRATOR_PORT']}",
        f"INTELLECT_ORCH_REDIS_URL=redis://127.0.0.1:{ports['REDIS_PORT']}/1",
        f"INTELLECT_ORCH_RPC_URL={rpc}",
        f"INTELLECT_ORCH_DISCOVERY_URL={discovery}",
        f"INTELLECT_ORCH_POOL_ID={POOL_ID}",
        f"INTELLECT_WORKER_RPC_URL={rpc}",
        f"INTELLECT_WORKER_DISCOVERY_URL={discovery}",
        f"INTELLECT_WORKER_POOL_ID={POOL_ID}",
        f"INTELLECT_DASHBOARD_PORT={ports['DASHBOARD_PORT']}",
        f"INTELLECT_DASHBOARD_ORCHESTRATOR_URL={orchestrator}",
        f"INTELLECT_DASHBOARD_RPC_URL={rpc}",
        f"INTELLECT_DASHBOARD_POOL_ID={POOL_ID}",
    ]


def _env_name(role: str) -> str:
    return "INTELLECT_KEY_" + role.upper().replace("-", "_")


@app.command("env")
def env(
    out: Path = typer.Option(Path("compose.env"), "--out", help="env file to write"),
    force: bool = typer.Option(False, "--force", help="replace an existing file (a new chain identity)"),
    free_ports: bool = typer.Option(
        False, "--free-ports", help="pick free ports instead of the defaults (8545, 8089, 8090, ...)"
    ),
) -> None:
    """Write the compose env file: a new mnemonic, the role keys it gives, and the ports."""
    if out.exists() and not force:
        err.print(f"{out} exists; keep it (same chain identity) or pass --force to replace it")
        raise typer.Exit(1)
    mnemonic = new_mnemonic()
    lines = [
        "# Written by `intellect compose env`: keys for a local compose network. Never commit this file.",
        f"INTELLECT_MNEMONIC={mnemonic}",
        f"INTELLECT_ACCOUNTS={len(ROLES)}",
    ]
    lines += [f"{_env_name(role)}={key}" for role, key in role_keys(mnemonic).items()]
    ports = {name: free_port() for name in PORTS} if free_ports else PORTS
    lines += [f"{name}={port}" for name, port in ports.items()]
    lines += service_env(ports)
    out.write_text("\n".join(lines) + "\n")
    out.chmod(0o600)
    print(f"wrote {out} (mode 0600)")


@app.command("bootstrap")
def bootstrap_cmd(
    rpc_url: str = typer.Option(..., "--rpc-url", envvar="INTELLECT_RPC_URL", help="the chain to set up"),
    out_dir: Path = typer.Option(
        Path("/shared"), "--out", help="where deployment.json and bootstrap.json go"
    ),
) -> None:
    """Deploy the contracts and create the demo pool, with keys from INTELLECT_KEY_* variables."""
    missing = [_env_name(r) for r in ROLES if not os.environ.get(_env_name(r))]
    if missing:
        err.print(f"missing keys in the environment: {', '.join(missing)} (run `intellect compose env`)")
        raise typer.Exit(1)
    wallets = {role: Wallet.from_key(os.environ[_env_name(role)]) for role in ROLES}
    try:
        done = bootstrap(rpc_url, wallets, out_dir, progress=lambda m: print(m, flush=True))
    except Exception as exc:
        err.print(f"bootstrap failed: {exc}")
        raise typer.Exit(1) from None
    if done.pool_id != POOL_ID:
        err.print(
            f"the chain's demo pool is {done.pool_id}, the env file expects {POOL_ID}: start a fresh chain"
        )
        raise typer.Exit(1)
    print(done.model_dump_json(indent=2))
