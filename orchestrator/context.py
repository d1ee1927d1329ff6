"""Everything a running orchestrator holds, built by the app's lifespan and shared by routes and loops."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from redis.asyncio import Redis
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.chain import PoolChain
from orchestrator.clients import SignedClient
from orchestrator.live import LiveStore
from orchestrator.scheduling import PlanCache
from orchestrator.settings import OrchestratorSettings
from orchestrator.store.assignments import AssignmentStore
from orchestrator.store.hardware import HardwareBook
from orchestrator.store.nodes import NodeBook
from orchestrator.store.round_trips import RoundTripBook
from orchestrator.store.tasks import TaskStore
from orchestrator.store.uploads import UploadStore

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.heartbeats = Counter("orchestrator_heartbeats", "heartbeats by result", ["result"], registry=r)
        self.heartbeat_seconds = Histogram(
            "orchestrator_heartbeat_seconds", "heartbeat handling time", registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        # Gauges are set by the one loop leader; across processes the most recent value is the truth.
        self.nodes = Gauge("orchestrator_nodes", "nodes by state", ["state"], registry=r,
                           multiprocess_mode="mostrecent")
        self.tasks = Gauge("orchestrator_tasks", "live (not deleted) tasks", registry=r,
                           multiprocess_mode="mostrecent")
        self.invites = Counter("orchestrator_invites", "invites sent by result", ["result"], registry=r)
        self.ejections = Counter("orchestrator_ejections", "dead nodes ejected on chain", registry=r)
        self.hardware = Counter("orchestrator_hardware_challenges", "hardware challenges by outcome",
                                ["outcome"], registry=r)  # fmt: skip

    def exposition(self) -> bytes:
        """The `/metrics` body: this process's registry, or under `serve --workers N` (multiprocess
        mode) the samples of every process, summed from PROMETHEUS_MULTIPROC_DIR."""
        if os.environ.get(MULTIPROC_ENV):
            merged = CollectorRegistry()
            MultiProcessCollector(merged)
            return generate_latest(merged)
        return generate_latest(self.registry)


@dataclass
class Context:
    """Built once per process by the server's lifespan and kept on `app.state.ctx`: routes reach it
    through `orchestrator.api.deps`, the background loops get it as an argument. Every SQL write goes
    through one of its stores (`orchestrator/store/`); the group keeper's pass writes through
    `orchestrator/store/groups.py` inside its own transaction."""

    settings: OrchestratorSettings
    redis: Redis
    sessions: sessionmaker[Session]
    live: LiveStore
    book: NodeBook
    tasks: TaskStore
    plans: PlanCache
    chain: PoolChain
    peers: SignedClient
    metrics: Metrics
    hardware: HardwareBook
    round_trips: RoundTripBook
    assignments: AssignmentStore
    uploads: UploadStore
