"""How a background loop waits after a pass: its interval while passes succeed, longer while they fail.

Why: a loop whose Redis, database or RPC is gone used to fail and log a full traceback every pass
(three times a second with test settings), forever. A failing loop now doubles its wait up to a cap
and logs the 1st, 2nd, 4th, 8th... failure in a row, then says once when it recovers.
"""

from __future__ import annotations

import sys

import httpx
import structlog
from redis.exceptions import RedisError
from requests.exceptions import ConnectionError as RequestsConnectionError
from requests.exceptions import Timeout as RequestsTimeout
from sqlalchemy.exc import OperationalError

from intellect.errors import PeerError

log = structlog.get_logger("intellect.orchestrator.pacing")

MAX_BACKOFF_SECONDS = 30.0
# A service this loop needs did not answer (Redis, the database, the chain's RPC, discovery): a
# partition or an outage, said in one line. Anything else is a bug and keeps its traceback.
OUTAGES: tuple[type[BaseException], ...] = (
    RedisError, OperationalError, RequestsConnectionError, RequestsTimeout, httpx.TransportError, PeerError,
    ConnectionError, TimeoutError,
)


class Pacing:
    """The wait before a loop's next pass, from how its last passes went."""

    def __init__(self, name: str, interval: float, cap: float = MAX_BACKOFF_SECONDS) -> None:
        self.name = name
        self.interval = interval
        self.cap = max(cap, interval)
        self.failures = 0

    def succeeded(self) -> None:
        if self.failures:
            log.info("loop recovered", loop=self.name, failed_passes=self.failures)
        self.failures = 0

    def failed(self) -> None:
        """Count a failure (call it in the `except` block); log it on the 1st, 2nd, 4th, 8th... in a
        row: one line when a service it needs is unreachable, else with the traceback."""
        self.failures += 1
        if self.failures & (self.failures - 1):
            return
        exc = sys.exc_info()[1]
        context = {"failures_in_a_row": self.failures, "next_try_seconds": self.delay()}
        if isinstance(exc, OUTAGES):
            error = f"{type(exc).__name__}: {exc}"[:300]
            log.warning(f"{self.name} failed: a service it needs is unreachable", error=error, **context)
        else:
            log.exception(f"{self.name} failed", **context)

    def delay(self) -> float:
        """The interval while passes succeed; interval x 2^failures (capped) while they fail."""
        if not self.failures:
            return self.interval
        return min(self.cap, self.interval * (1 << min(self.failures, 16)))

    def wait_after(self, started: float, now: float) -> float:
        """Seconds to sleep after a pass that started at `started` (monotonic clock)."""
        return max(0.0, self.delay() - (now - started))
