"""`intellect.cli`: the app every service CLI starts from, and settings from flags over environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from intellect.cli import service_app, settings_from_flags
from orchestrator.settings import OrchestratorSettings


def test_flags_given_override_the_environment_and_unset_flags_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTELLECT_ORCH_POOL_ID", "7")
    monkeypatch.setenv("INTELLECT_ORCH_MISS_THRESHOLD", "3")
    s = settings_from_flags(OrchestratorSettings, pool_id=9, miss_threshold=None)
    assert (s.pool_id, s.miss_threshold) == (9, 3)


def test_a_bad_value_exits_2_naming_the_setting_and_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTELLECT_ORCH_HEARTBEAT_TTL_SECONDS", "soon")
    app = service_app("test app")

    @app.command()
    def show() -> None:
        settings_from_flags(OrchestratorSettings)

    @app.command()
    def other() -> None:  # two commands, so `show` is a subcommand as in the services
        raise typer.Exit(0)

    result = CliRunner().invoke(app, ["show"])
    assert result.exit_code == 2
    assert "heartbeat_ttl_seconds" in result.output
    assert "INTELLECT_ORCH_HEARTBEAT_TTL_SECONDS" in result.output
    assert "Traceback" not in result.output


def test_admin_token_and_show_config_are_the_same_for_every_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from discovery.cli import app as discovery_app
    from orchestrator.cli import app as orchestrator_app

    monkeypatch.setenv("INTELLECT_ORCH_MANAGER_KEY", "0x" + "11" * 32)
    runner = CliRunner()
    from intellect.auth import load_or_create_admin_token

    for app, state in ((orchestrator_app, tmp_path / "orch"), (discovery_app, tmp_path / "disc")):
        load_or_create_admin_token(state / "admin-token")  # what the service does on its first start
        first = runner.invoke(app, ["admin-token", "--state-dir", str(state), "--json"])
        assert first.exit_code == 0, first.output
        token = json.loads(first.output)
        assert token["file"] == str(state / "admin-token")
        again = runner.invoke(app, ["admin-token", "--state-dir", str(state)])
        assert again.output.strip() == token["token"] == (state / "admin-token").read_text().strip()
        config = runner.invoke(app, ["show-config", "--json"])
        assert config.exit_code == 0, config.output
        assert "11" * 32 not in config.output  # a key is never printed
    shown = json.loads(runner.invoke(orchestrator_app, ["show-config", "--json"]).output)
    assert shown["manager_key"] == "***"


def test_admin_token_never_makes_a_token_the_running_service_would_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No state there (a mistyped --state-dir, or none given and the default unused): one line saying
    so, exit 2, and no folder or token created."""
    from discovery.cli import app as discovery_app
    from orchestrator.cli import app as orchestrator_app

    monkeypatch.setenv("INTELLECT_HOME", str(tmp_path / "home"))
    for name in ("INTELLECT_ORCH_STATE_DIR", "INTELLECT_DISCOVERY_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for app, service in ((orchestrator_app, "orchestrator"), (discovery_app, "discovery")):
        typo = tmp_path / "orchestrater"
        for args in (["--state-dir", str(typo)], []):
            result = runner.invoke(app, ["admin-token", *args])
            assert result.exit_code == 2, result.output
            where = typo if args else tmp_path / "home" / service
            assert f"error: no {service} state in {where} (no admin-token file there)" in result.output
        assert not typo.exists() and not (tmp_path / "home").exists()
