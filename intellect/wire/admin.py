"""Orchestrator admin API replies (node listing, logs, restart, ban): what operators' tools read."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from intellect.wire.base import WireModel
from intellect.wire.heartbeat import TaskStatus
from intellect.wire.nodes import NodeState


class HardwareFigures(WireModel):
    """A node's latest hardware challenge (docs/hardware.md): what it proved, not what it claims."""

    outcome: Literal["proven", "wrong", "unopened", "unanswered"]
    at: datetime
    n: int
    precision: str
    flops: float | None = Field(default=None, description="proven lower bound on sustained FLOP/s")
    rtt_ms: float | None = Field(default=None, description="measured round trip to the node's API")
    seconds: float | None = Field(default=None, description="challenge sent to commitment received, round "
                                   "trip included")
    reasons: list[str] = Field(default_factory=list, description="why nothing was proven")


def hardware_summary(figures: dict[str, Any]) -> str:
    """One line for a node's latest challenge, as `/nodes` returns it (JSON): `76.5 GFLOP/s float32
    (n=1024), rtt 0.8 ms`, or the outcome and why nothing was proven. The CLI, the dashboard and the
    demo report all show it this way."""
    if figures.get("outcome") != "proven":
        return f"{figures.get('outcome')}: {'; '.join(figures.get('reasons') or [])}"[:200]
    shown = f"{figures['flops'] / 1e9:.1f} GFLOP/s {figures['precision']} (n={figures['n']})"
    rtt = figures.get("rtt_ms")
    return shown + (f", rtt {rtt:.1f} ms" if rtt is not None else "")


class HardwareHistory(WireModel):
    node_address: str
    proofs: list[HardwareFigures]
    evidence: list[dict[str, Any]] = Field(
        default_factory=list, description="the signed evidence of each wrong answer (challenge, commitment, "
        "secret and answer: anyone can check it again) and of each commitment not opened (challenge, "
        "commitment, secret, `unopened`: what happened), newest first",
    )  # fmt: skip
    round_trips: dict[str, float] = Field(
        default_factory=dict, description="ms to each node both ends measured (the larger of their figures); "
        "groups are placed by those whose ends agree (docs/hardware.md)",
    )  # fmt: skip


class NodeRecord(WireModel):
    address: str
    state: NodeState
    provider: str | None = None
    worker_url: str | None = None
    in_pool: bool = False
    misses: int = 0
    invite_attempts: int = 0
    reason: str | None = Field(default=None, description="why the node is in its state, e.g. an invite error")
    joined_via: Literal["push", "pull"] | None = Field(
        default=None, description="how its last invite reached it: push (the orchestrator called its API) or "
        "pull (left at discovery and fetched by the node: behind NAT, no open port)")
    last_heartbeat_at: datetime | None = None
    state_changed_at: datetime | None = None
    task: TaskStatus | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    worker_version: str | None = None
    hardware: HardwareFigures | None = Field(default=None, description="its latest hardware challenge")


class NodeList(WireModel):
    counts: dict[str, int]
    nodes: list[NodeRecord]


class NodeLogs(WireModel):
    node_address: str
    lines: list[str]


class NodeActionResult(WireModel):
    node_address: str
    ok: bool
    detail: str | None = None
    tx_hash: str | None = None


class GroupRecord(WireModel):
    """One node group as the orchestrator formed it: its members in pipeline order."""

    id: str
    topology: str
    task_id: str | None = None
    nodes: list[str] = Field(default_factory=list, description="member addresses, position order")
    created_at: datetime


class GroupList(WireModel):
    groups: list[GroupRecord]
