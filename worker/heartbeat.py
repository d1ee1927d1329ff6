"""Heartbeats: every interval, tell the orchestrator how the task is doing; apply the task it returns.

Pull model: the reply's `current_task` is the desired state; the runtime reconciles to it and the
resulting status goes out with the next heartbeat. All HTTP calls have timeouts; failures are
logged and retried at the next tick, never fatal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from intellect.identity import Wallet
from intellect.signing import SignedAuth
from intellect.wire.heartbeat import HeartbeatRequest, HeartbeatResponse, TaskStatus
from worker import __version__

log = logging.getLogger("intellect.worker.heartbeat")


class HeartbeatRefused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"orchestrator refused the heartbeat ({status}): {reason}")
        self.status = status
        self.reason = reason


@dataclass
class HeartbeatStats:
    sent: int = 0
    failed: int = 0
    consecutive_failures: int = 0
    last_error: str | None = None
    last_response: HeartbeatResponse | None = field(default=None, repr=False)


class Heartbeater:
    def __init__(
        self,
        node: Wallet,
        runtime: object,
        *,
        interval: float,
        timeout: float,
        initial_status: TaskStatus | None = None,
        on_status: Callable[[TaskStatus | None], None] | None = None,
        metrics: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        self.node = node
        self.runtime = runtime
        self.interval = interval
        self.timeout = timeout
        self.status = initial_status
        self.on_status = on_status
        self.metrics = metrics or (lambda: {})
        self.stats = HeartbeatStats()
        self._client: httpx.AsyncClient | None = None

    def _client_for(self, orchestrator_url: str) -> httpx.AsyncClient:
        """One keep-alive connection per orchestrator: a new TCP connection per beat costs the server."""
        base = orchestrator_url.rstrip("/")
        if self._client is None or str(self._client.base_url).rstrip("/") != base:
            old, self._client = self._client, httpx.AsyncClient(
                base_url=base, timeout=self.timeout, auth=SignedAuth(self.node)
            )
            if old is not None:
                asyncio.get_running_loop().create_task(old.aclose())
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def beat(self, orchestrator_url: str, *, leaving: bool = False) -> HeartbeatResponse:
        request = HeartbeatRequest(task=self.status, metrics=self.metrics(), worker_version=__version__,
                                   leaving=leaving)
        body = request.model_dump_json().encode()
        client = self._client_for(orchestrator_url)
        response = await client.post("/heartbeat", content=body, headers={"Content-Type": "application/json"})
        if response.status_code >= 400:
            try:
                reason = response.json().get("detail", response.text)
            except ValueError:
                reason = response.text
            raise HeartbeatRefused(response.status_code, str(reason))
        reply = HeartbeatResponse.model_validate_json(response.content)
        self.stats.sent += 1
        self.stats.consecutive_failures = 0
        self.stats.last_response = reply
        return reply

    async def tick(self, orchestrator_url: str) -> HeartbeatResponse | None:
        """One heartbeat, then apply the desired task. Returns None if the heartbeat failed."""
        try:
            reply = await self.beat(orchestrator_url)
        except (httpx.HTTPError, HeartbeatRefused, ValueError) as exc:
            self.stats.failed += 1
            self.stats.consecutive_failures += 1
            self.stats.last_error = str(exc) or type(exc).__name__
            log.warning("heartbeat to %s failed: %s", orchestrator_url, self.stats.last_error)
            return None
        try:
            status = await asyncio.to_thread(self.runtime.apply, reply.current_task)  # type: ignore[attr-defined]
        except Exception as exc:  # the runtime must never take the heartbeat down
            log.exception("runtime failed to apply the task")
            status = (self.status.model_copy(update={"detail": f"runtime error: {exc}"})
                      if self.status else None)
        if status != self.status:
            self.status = status
            if self.on_status:
                self.on_status(status)
        return reply

    def next_delay(self) -> float:
        """The configured interval, or the orchestrator's if it asks for more frequent beats."""
        suggested = self.stats.last_response.interval_seconds if self.stats.last_response else self.interval
        return max(0.05, min(self.interval, suggested))
