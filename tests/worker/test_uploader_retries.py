"""An upload stuck behind a cut link says so on each failed attempt (one line, not a traceback), then
goes through when the link is back."""

from __future__ import annotations

from pathlib import Path

import httpx
import structlog

from intellect.identity import Wallet
from worker.files import WorkerFiles
from worker.uploader import Uploader


class NoChain:  # the retries under test never reach the chain
    node, pool_id = "0x0", 0

    def submit(self, work_key: str, units: int) -> str:
        raise AssertionError("not called")

    def owner_of(self, work_key: str) -> str | None:
        raise AssertionError("not called")

    def submission_tx(self, work_key: str) -> str | None:
        raise AssertionError("not called")


def test_each_failed_attempt_is_one_warning_line(tmp_path: Path) -> None:
    uploader = Uploader(Wallet.create(), WorkerFiles(tmp_path / "files.sqlite"), NoChain(), lambda: None,
                        attempts=4, backoff=0.01)  # fmt: skip
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise httpx.ConnectTimeout("timed out")  # what a cut link looks like from the worker
        return "stored"

    with structlog.testing.capture_logs() as logs:
        assert uploader.retrying.copy()(flaky) == "stored"
    said = [e for e in logs if e["event"] == "upload attempt failed, retrying"]
    assert [e["attempt"] for e in said] == [1, 2] and all(e["log_level"] == "warning" for e in said)
    assert said[0]["error"] == "ConnectTimeout: timed out" and "exc_info" not in said[0]
