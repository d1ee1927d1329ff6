"""`intellect-broadcast` refuses a folder or an upstream that cannot be right, at start, exit 2: an
origin watching nothing or a relay polling nothing would run on and serve nothing."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from workloads.broadcast.cli import app


def test_origin_refuses_a_watch_folder_that_does_not_exist(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["origin", "--dir", str(tmp_path / "o"), "--watch", "/nonexistent"])
    assert result.exit_code == 2, result.output
    assert "error: --watch /nonexistent: no such folder" in result.output
    assert not (tmp_path / "o").exists()


def test_relay_refuses_an_upstream_that_is_not_a_url(tmp_path: Path) -> None:
    for upstream in ("notaurl", "htp://x", "http://"):
        result = CliRunner().invoke(app, ["relay", "--upstream", upstream, "--dir", str(tmp_path / "r")])
        assert result.exit_code == 2, result.output
        assert f"error: --upstream '{upstream}' is not a URL" in result.output
    assert not (tmp_path / "r").exists()
