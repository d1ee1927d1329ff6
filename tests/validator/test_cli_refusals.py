"""`intellect-validator run` refuses a bad start in one line naming what to fix, exit 2, no traceback;
and its default data folder is the deployment's own, so two chains never share a cursor or verdicts."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from validator.cli import app, with_chain_data_dir
from validator.settings import ValidatorSettings

KEY = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d"  # anvil's second dev key


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("INTELLECT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("INTELLECT_VALIDATOR_KEY", KEY)
    for name in ("RPC_URL", "DEPLOYMENT", "DATA_DIR"):
        monkeypatch.delenv(f"INTELLECT_VALIDATOR_{name}", raising=False)
    monkeypatch.chdir(tmp_path)  # no stray .env
    return tmp_path / "home"


def refusal(args: list[str]) -> str:
    result = CliRunner().invoke(app, ["run", *args])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.output


def test_a_missing_deployment_file_is_named(home: Path) -> None:
    out = refusal(["--deployment", "/nope.json"])
    assert "error: no deployment file at /nope.json" in out
    assert not (home / "validator").exists()


def test_neither_flag_names_the_default_deployment_file(home: Path) -> None:
    out = refusal([])
    assert f"no deployment file at {home / 'deployment.json'}" in out


def test_a_chain_nothing_listens_on_is_named(home: Path, tmp_path: Path, devnet) -> None:  # noqa: ANN001
    deployment = devnet.deployment.save(tmp_path / "deployment.json")
    out = refusal(["--rpc-url", "http://127.0.0.1:1", "--deployment", str(deployment)])
    assert "error: cannot reach the chain at http://127.0.0.1:1" in out
    assert not (home / "validator").exists()


def test_the_default_data_dir_is_per_chain_and_deployment(home: Path, tmp_path: Path, devnet) -> None:  # noqa: ANN001
    deployment = devnet.deployment.save(tmp_path / "deployment.json")
    settings = with_chain_data_dir(ValidatorSettings(rpc_url=devnet.rpc_url, deployment=deployment))
    pool = devnet.deployment.address("ComputePool").lower()
    assert settings.data_dir.parent == home / "validator"
    assert settings.data_dir.name.startswith(f"{devnet.deployment.chain_id}-{pool}-")
    given = ValidatorSettings(rpc_url=devnet.rpc_url, deployment=deployment, data_dir=tmp_path / "mine")
    assert with_chain_data_dir(given).data_dir == tmp_path / "mine"  # a given folder is used as is


def test_a_taken_api_port_stops_the_validator(home: Path, tmp_path: Path, devnet) -> None:  # noqa: ANN001
    """Before, uvicorn logged its bind error and the validator judged on without an API (no /verdicts,
    no /health): a README run then polled whatever held the port. Now it exits 1 before judging."""
    deployment = devnet.deployment.save(tmp_path / "deployment.json")
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    try:
        result = CliRunner().invoke(app, ["run", "--rpc-url", devnet.rpc_url, "--deployment", str(deployment),
                                          "--data-dir", str(tmp_path / "data"), "--port", str(port)])
    finally:
        taken.close()
    assert result.exit_code == 1, result.output
    assert f"error: cannot serve the validator API on 127.0.0.1:{port}" in result.output
    assert "Traceback" not in result.output
