"""`intellect-broadcast` refuses a folder or an upstream that cannot be right, at start, exit 2: an
origin watching nothing or a relay polling nothing would run on and serve nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.broadcast.helpers import REPO, SHARD, random_file, sha256, start_origin
from tests.support.testing import ServerThread
from workloads.broadcast.cli import FetchArgs, app, parse_fetch
from workloads.broadcast.origin import publish


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



def _parsed(argv: list[str]) -> FetchArgs:
    args = parse_fetch(argv)
    assert args is not None, argv
    return args


def test_quick_fetch_takes_exactly_a_plain_fetch(monkeypatch: pytest.MonkeyPatch) -> None:
    """cli.py's quick path parses `[--log-level L] fetch ...` as typer would; anything it does not
    know (help, an unknown option, a bad value) is left to the typer app (None)."""
    for name in ("INTELLECT_LOG_LEVEL", "INTELLECT_BROADCAST_CLIENT_CONCURRENCY",
                 "INTELLECT_BROADCAST_TIMEOUT_SECONDS"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    args = _parsed(["--log-level", "warning", "fetch", "--version", "3", "--out=/tmp/o", "--relay",
                    "http://a", "--relay=http://b", "--sha256", "ab", "--concurrency", "2", "--wait=1.5",
                    "--json"])  # fmt: skip
    assert (args.version, args.out, args.relays, args.sha256) == (3, "/tmp/o", ["http://a", "http://b"], "ab")
    assert (args.concurrency, args.wait, args.as_json, args.shardcast) == (2, 1.5, True, False)
    assert args.log_level == "warning"
    plain = ["fetch", "--version", "1", "--out", "o", "--relay", "http://a"]
    assert _parsed([*plain, "--shardcast"]).shardcast
    refused = [
        ["fetch", "--help"], [*plain, "--bogus"], ["fetch", "--out", "o", "--relay", "http://a"],
        ["fetch", "--version", "0", "--out", "o", "--relay", "http://a"], [*plain, "--wait", "-1"],
        [*plain, "--concurrency", "x"], [*plain, "--concurrency", "0"], [*plain, "--version"],
        ["publish", "f", "--version", "1"], ["--log-level", "loud", *plain],
    ]  # fmt: skip
    for argv in refused:
        assert parse_fetch(argv) is None, argv
    monkeypatch.setenv("INTELLECT_BROADCAST_CLIENT_CONCURRENCY", "3")
    assert _parsed(plain).concurrency == 3
    monkeypatch.setenv("intellect_broadcast_timeout_seconds", "0")  # invalid: typer's settings say why
    assert parse_fetch(plain) is None


def test_quick_fetch_and_typer_fetch_print_the_same(tmp_path: Path, servers: list[ServerThread]) -> None:
    """The same fetch through the quick path and through the typer app (forced by a `.env`): same
    stdout, same errors and exit codes, logs on stderr only."""
    origin = start_origin(tmp_path / "origin")
    servers.append(origin)
    src = random_file(tmp_path / "ckpt", 3 * SHARD)
    publish(origin.server.config.app.state.store, src, 1, SHARD)
    run = [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
           "from workloads.broadcast.cli import main; main()", str(REPO)]  # fmt: skip
    typer_dir = tmp_path / "with-env"
    typer_dir.mkdir()
    (typer_dir / ".env").write_text("INTELLECT_LOG_LEVEL=info\n")
    outputs = []
    for cwd in (tmp_path, typer_dir):
        fetch = [*run, "fetch", "--version", "1", "--out", str(cwd / "out"), "--relay", origin.url, "--json"]
        got = subprocess.run(fetch, capture_output=True, text=True, cwd=cwd, timeout=120)
        assert got.returncode == 0, got.stderr
        assert sha256(cwd / "out") == sha256(src)
        assert '"event": "downloaded"' in got.stderr  # logs on stderr as JSON lines, at info
        outputs.append(sorted(json.loads(got.stdout)))
        fetch = [*run, "fetch", "--version", "9", "--out", str(cwd / "x"), "--relay", origin.url]
        missing = subprocess.run(fetch, capture_output=True, text=True, cwd=cwd, timeout=120)
        assert missing.returncode == 1 and "error: no relay holds version 9" in missing.stderr
    assert outputs[0] == outputs[1]
