"""Everything a running orchestrator holds, built by the app's lifespan and shared by routes and loops."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from redis.asyncio import Redis
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.chain import PoolChain
from orchestrator.clients import SignedClient
from orchestrator.live import LiveStore
from orchestrator.nodes import NodeBook
from orchestrator.scheduling import PlanCache
from orchestrator.settings import OrchestratorSettings


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
        self.nodes = Gauge("orchestrator_nodes", "nodes by state", ["state"], registry=r)
        self.tasks = Gauge("orchestrator_tasks", "live (not deleted) tasks", registry=r)
        self.invites = Counter("orchestrator_invites", "invites sent by result", ["result"], registry=r)
        self.ejections = Counter("orchestrator_ejections", "dead nodes ejected on chain", registry=r)


@dataclass
class Context:
    settings: OrchestratorSettings
    redis: Redis
    sessions: sessionmaker[Session]
    live: LiveStore
    book: NodeBook
    plans: PlanCache
    chain: PoolChain
    peers: SignedClient
    metrics: Metrics
