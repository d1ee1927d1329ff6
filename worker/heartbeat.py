"""Heartbeats: every interval, tell the orchestrator how the task is doing; apply the task it returns.

Applying runs beside the beats, never in their way: a reconcile that takes longer than half an interval
(an image pull) continues in the background while the node keeps beating with its last status.

Pull model: the reply's `current_task` is the desired state; the runtime reconciles to it and the
resulting status goes out with the next heartbeat. The beat goes through the one orchestrator client
(`intellect.client`, signed by the node key, one try: the next tick is the retry) on a thread, so the
loop never waits on the network. All HTTP calls have timeouts; failures are logged and retried at the
next tick, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from intellect.client import OrchestratorClient, TaskApiError
from intellect.errors import PeerError, PeerRefused, PeerUnreachable
from intellect.identity import Wallet
from intellect.wire.heartbeat import HeartbeatRequest, HeartbeatResponse, TaskStatus
from intellect.wire.tasks import AssignedTask, TaskState
from worker import __version__
from worker.runtime.base import Runtime

log = structlog.get_logger("intellect.worker.heartbeat")
SUCCESSOR_METRIC = "worker_successor_rtt_ms"
SUCCESSOR_PROBE_SECONDS = 30.0


async def handshake_ms(address: str, tries: int = 3, timeout: float = 5.0) -> float | None:
    """The shortest of `tries` TCP handshakes to `host:port` (its kernel answers: nothing the member's
    program does can shorten it), in ms; None when it cannot be reached or is not host:port."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    best: float | None = None
    for _ in range(tries):
        started = time.perf_counter()
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout)
        except (OSError, TimeoutError):
            return best
        elapsed = (time.perf_counter() - started) * 1000
        best = elapsed if best is None else min(best, elapsed)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return best


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
        runtime: Runtime,
        *,
        interval: float,
        timeout: float,
        initial_status: TaskStatus | None = None,
        on_status: Callable[[TaskStatus | None], None] | None = None,
    ) -> None:
        self.node = node
        self.runtime = runtime
        self.interval = interval
        self.timeout = timeout
        self.status = initial_status
        self.on_status = on_status
        self.stats = HeartbeatStats()
        self._client: OrchestratorClient | None = None
        self._applying: asyncio.Task[None] | None = None
        # The round trip to the next member of this node's group (its peer inbox), measured here and
        # sent with the beats as the metric `worker_successor_rtt_ms` (docs/hardware.md).
        self.successor: str | None = None
        self.successor_rtt_ms: float | None = None
        self._probed_at = 0.0
        self._probing: asyncio.Task[None] | None = None

    def _client_for(self, orchestrator_url: str) -> OrchestratorClient:
        """One keep-alive connection per orchestrator: a new TCP connection per beat costs the server."""
        base = orchestrator_url.rstrip("/")
        if self._client is None or self._client.url != base:
            old, self._client = self._client, OrchestratorClient(base, wallet=self.node, timeout=self.timeout,
                                                                 retries=1)  # fmt: skip
            if old is not None:
                old.close()
        return self._client

    async def aclose(self) -> None:
        if self._probing is not None and not self._probing.done():
            self._probing.cancel()
        if self._applying is not None and not self._applying.done():
            await asyncio.wait({self._applying}, timeout=self.timeout)
        if self._client is not None:
            self._client.close()
            self._client = None

    async def beat(self, orchestrator_url: str, *, leaving: bool = False) -> HeartbeatResponse:
        metrics = dict(self.runtime.metrics())
        if self.successor_rtt_ms is not None:
            metrics[SUCCESSOR_METRIC] = round(self.successor_rtt_ms, 3)
        request = HeartbeatRequest(task=self.status, metrics=metrics, worker_version=__version__,
                                   leaving=leaving)  # fmt: skip
        client = self._client_for(orchestrator_url)
        try:
            reply = await asyncio.to_thread(client.heartbeat, request)
        except TaskApiError as exc:
            peer = f"orchestrator {orchestrator_url}"
            if exc.status == 0:
                raise PeerUnreachable(peer, exc.reason) from None
            raise PeerRefused(exc.status, exc.reason, peer) from None
        self.stats.sent += 1
        self.stats.consecutive_failures = 0
        self.stats.last_response = reply
        return reply

    async def tick(self, orchestrator_url: str) -> HeartbeatResponse | None:
        """One heartbeat, then apply the desired task. Returns None if the heartbeat failed."""
        try:
            reply = await self.beat(orchestrator_url)
        except (PeerError, ValueError) as exc:
            self.stats.failed += 1
            self.stats.consecutive_failures += 1
            self.stats.last_error = str(exc) or type(exc).__name__
            log.warning("heartbeat failed", orchestrator=orchestrator_url, error=self.stats.last_error)
            return None
        if self._applying is None or self._applying.done():
            self._applying = asyncio.create_task(self._apply_and_record(reply.current_task))
        self._probe_successor(reply.current_task)
        # A quick reconcile (the usual case) is reported with the next beat, as before; a slow one
        # (an image pull, a big mount) goes on in the background and the beats go on meanwhile:
        # with a 15 s TTL a pull that held the loop would get a working node declared dead.
        await asyncio.wait({self._applying}, timeout=max(0.05, self.next_delay() / 2))
        return reply

    def _probe_successor(self, desired: AssignedTask | None) -> None:
        """Measure the round trip to the group's next member now and then, beside the beats."""
        group = desired.group if desired is not None else None
        successor = group.next_p2p_address if group is not None else None
        if successor != self.successor:
            self.successor, self.successor_rtt_ms, self._probed_at = successor, None, 0.0
        if successor is None or (self._probing is not None and not self._probing.done()):
            return
        if time.monotonic() - self._probed_at < SUCCESSOR_PROBE_SECONDS:
            return
        self._probed_at = time.monotonic()

        async def probe() -> None:
            measured = await handshake_ms(successor)
            if self.successor == successor:
                self.successor_rtt_ms = measured

        self._probing = asyncio.create_task(probe())

    async def _apply_and_record(self, desired: AssignedTask | None) -> None:
        status = await self.apply(desired)
        if status != self.status:
            self.status = status
            if self.on_status:
                self.on_status(status)

    async def apply(self, desired: AssignedTask | None) -> TaskStatus | None:
        """The runtime's status for `desired`. If the runtime raises, the desired task is reported
        failed with the reason: never the previous task's status, which would hide the failure."""
        try:
            return await asyncio.to_thread(self.runtime.apply, desired)
        except Exception as exc:  # the runtime must never take the heartbeat down
            log.exception("runtime failed to apply the task")
            if desired is None:
                return None
            return TaskStatus(task_id=desired.task.id, state=TaskState.FAILED,
                              config_hash=desired.task.spec.config_hash(),
                              detail=f"the worker could not start the task: {exc}"[:4096])

    def next_delay(self) -> float:
        """The configured interval, or the orchestrator's if it asks for more frequent beats."""
        suggested = self.stats.last_response.interval_seconds if self.stats.last_response else self.interval
        return max(0.05, min(self.interval, suggested))
