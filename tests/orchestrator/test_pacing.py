"""A failing background loop: its wait doubles up to a cap, it logs the 1st, 2nd, 4th... failure in a
row, an unreachable service in one line (a partition is not a bug) and anything else with its
traceback, and says once when it recovered."""

from __future__ import annotations

import structlog
from redis.exceptions import ConnectionError as RedisConnectionError

from orchestrator.pacing import Pacing


def fail(pacing: Pacing, exc: Exception) -> None:
    try:
        raise exc
    except Exception:
        pacing.failed()


def test_an_unreachable_service_is_one_line_and_a_bug_keeps_its_traceback() -> None:
    pacing = Pacing("liveness check", interval=1.0, cap=8.0)
    with structlog.testing.capture_logs() as logs:
        for _ in range(5):
            fail(pacing, RedisConnectionError("Timeout connecting to 10.88.1.11:6379"))
        fail(pacing, ValueError("a bug"))
        delay = pacing.delay()
        pacing.succeeded()
    assert [e["failures_in_a_row"] for e in logs if "failures_in_a_row" in e] == [1, 2, 4]  # not 3, 5, 6
    outage = [e for e in logs if e.get("failures_in_a_row") in (1, 2, 4)]
    assert all(e["log_level"] == "warning" and "exc_info" not in e for e in outage)
    assert outage[0]["event"] == "liveness check failed: a service it needs is unreachable"
    assert outage[0]["error"] == "ConnectionError: Timeout connecting to 10.88.1.11:6379"
    assert delay == 8.0 and pacing.delay() == 1.0  # capped while failing, the interval once recovered
    assert logs[-1]["event"] == "loop recovered" and logs[-1]["failed_passes"] == 6


def test_a_bug_is_logged_with_its_traceback() -> None:
    pacing = Pacing("group reconcile", interval=1.0)
    with structlog.testing.capture_logs() as logs:
        fail(pacing, KeyError("member"))
    assert logs[0]["event"] == "group reconcile failed" and logs[0]["exc_info"] is True
    assert logs[0]["log_level"] == "error"
