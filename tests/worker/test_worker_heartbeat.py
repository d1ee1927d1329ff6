"""What the heartbeat reports: a task the runtime cannot start, and the round trip to the group's next
member."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

from fastapi import FastAPI, Request

from intellect.identity import Wallet
from intellect.wire.heartbeat import HeartbeatResponse, TaskStatus
from intellect.wire.tasks import AssignedTask, GroupContext, Task, TaskSpec, TaskState
from tests.support.testing import serve_in_thread
from worker.heartbeat import SUCCESSOR_METRIC, Heartbeater, handshake_ms
from worker.runtime.recording import RecordingRuntime


class BrokenRuntime(RecordingRuntime):
    """A runtime whose start fails with an unexpected error (not a transient engine problem)."""

    def apply(self, desired: AssignedTask | None) -> TaskStatus | None:
        if desired is not None and desired.task.id == "new":
            raise RuntimeError("cannot mount /data: permission denied")
        return super().apply(desired)


def assigned(task_id: str) -> AssignedTask:
    spec = TaskSpec(name=task_id, image="python:3.11-slim", cmd=["true"])
    return AssignedTask(task=Task(id=task_id, spec=spec, created_at=datetime.now(UTC)))


def test_a_task_that_cannot_start_is_reported_failed_with_the_reason() -> None:
    beater = Heartbeater(Wallet.create(), BrokenRuntime(), interval=1, timeout=1)
    old = asyncio.run(beater.apply(assigned("old")))
    assert old is not None and old.task_id == "old" and old.state == TaskState.RUNNING
    beater.status = old
    new = asyncio.run(beater.apply(assigned("new")))
    assert new is not None and new.task_id == "new"  # not the previous task's status
    assert new.state == TaskState.FAILED and "permission denied" in (new.detail or "")
    assert asyncio.run(beater.apply(None)) is None


def test_the_round_trip_to_the_next_member_goes_out_with_the_beats() -> None:
    """A group member measures its successor's peer inbox (TCP handshakes, a real listener on loopback)
    and sends it with its beats as the metric `worker_successor_rtt_ms`; an unreachable successor and
    an address that is not host:port are not measured."""
    received: list[dict] = []
    orchestrator = FastAPI()

    @orchestrator.post("/heartbeat")
    async def heartbeat(request: Request) -> dict:
        received.append(json.loads(await request.body()))
        return HeartbeatResponse(interval_seconds=1).model_dump(mode="json")

    server = serve_in_thread(orchestrator)

    async def scenario() -> tuple[float | None, float | None]:
        inbox = await asyncio.start_server(lambda reader, writer: writer.close(), "127.0.0.1", 0)
        port = inbox.sockets[0].getsockname()[1]
        try:
            beater = Heartbeater(Wallet.create(), RecordingRuntime(), interval=1, timeout=5)
            task = assigned("grouped").model_copy(update={"group": GroupContext(
                group_id="g", group_index=0, group_size=2, next_p2p_address=f"127.0.0.1:{port}")})
            await beater.beat(server.url)  # before any group: nothing measured
            beater._probe_successor(task)  # what a beat's reply with this task starts
            assert beater._probing is not None
            await beater._probing
            await beater.beat(server.url)
            await beater.aclose()
        finally:
            inbox.close()
            await inbox.wait_closed()
        return beater.successor_rtt_ms, await handshake_ms(f"127.0.0.1:{port}")  # nothing listens now

    try:
        measured, closed = asyncio.run(scenario())
    finally:
        server.stop()
    assert SUCCESSOR_METRIC not in received[0]["metrics"]
    assert measured is not None and received[1]["metrics"][SUCCESSOR_METRIC] == round(measured, 3)
    assert 0 < measured < 1000
    assert closed is None
    assert asyncio.run(handshake_ms("/ip4/10.0.0.2/tcp/1")) is None
