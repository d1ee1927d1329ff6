"""`intellect.cli`: the app every service CLI starts from, and settings from flags over environment."""

from __future__ import annotations

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
