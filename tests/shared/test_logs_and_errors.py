"""The one logging set-up and the one "peer refused" error (intellect.logs, intellect.errors)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import httpx
import pytest
import structlog

from intellect.errors import PeerRefused, PeerUnreachable, reason_of
from intellect.logs import setup_logging


def test_importing_intellect_configures_no_logging() -> None:
    code = ("import logging, structlog, intellect, intellect.logs, intellect.errors;"
            "print(len(logging.getLogger().handlers), structlog.is_configured())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "False"]


def test_json_lines_for_structlog_and_stdlib_alike(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTELLECT_LOG_FORMAT", "json")
    monkeypatch.setenv("INTELLECT_LOG_LEVEL", "info")
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    try:
        setup_logging()
        setup_logging()  # twice: still one handler
        structlog.get_logger("t.struct").info("hello", node="0xabc")
        logging.getLogger("t.std").warning("count %d", 3)
        logging.getLogger("t.std").debug("hidden")
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    finally:
        for handler in [h for h in root.handlers if h not in before[0]]:
            root.removeHandler(handler)
        root.setLevel(before[1])
        structlog.reset_defaults()
    assert [(x["event"], x["level"], x["logger"]) for x in lines] == [
        ("hello", "info", "t.struct"), ("count 3", "warning", "t.std")]
    assert lines[0]["node"] == "0xabc"


def test_a_bad_level_names_what_to_fix() -> None:
    with pytest.raises(ValueError, match="unknown log level 'LOUD'"):
        setup_logging("loud")


def test_peer_refused_carries_status_reason_and_peer() -> None:
    response = httpx.Response(403, json={"detail": "provider 0x1 is blacklisted"})
    exc = PeerRefused.from_response(response, "discovery http://d")
    assert (exc.status, exc.reason, exc.peer) == (403, "provider 0x1 is blacklisted", "discovery http://d")
    assert str(exc) == "discovery http://d refused (403): provider 0x1 is blacklisted"
    assert str(PeerRefused(422, "too small")) == "too small"
    assert reason_of(httpx.Response(400, text="plain")) == "plain"
    assert reason_of(httpx.Response(422, json={"detail": [{"loc": ["x"]}]})) == "[{'loc': ['x']}]"
    assert str(PeerUnreachable("http://w", "ConnectError")) == "http://w unreachable: ConnectError"


def test_logs_follow_stderr_when_it_is_swapped_and_closed() -> None:
    """A CLI run inside a test runner (typer's CliRunner) sets logging up on a stderr the runner closes
    afterwards; a later line (the validator's migration logs, before its port check) must reach the
    stderr of its own time, not fail with "I/O operation on closed file"."""
    import io
    import sys

    from intellect.logs import route_logs

    before = sys.stderr
    try:
        sys.stderr = io.StringIO()
        route_logs("info", "json")
        sys.stderr.close()
        sys.stderr = now = io.StringIO()
        logging.getLogger("alembic.runtime.migration").info("Context impl SQLiteImpl.")
        assert '"event": "Context impl SQLiteImpl."' in now.getvalue()
        assert "Logging error" not in now.getvalue()
    finally:
        sys.stderr = before
        route_logs("info", "json")
