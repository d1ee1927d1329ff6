"""The trainer as its step server sees it (`workloads.trainer.step_counter.TrainerView`), for tests that
serve the real step server over a checkpoint folder they fill themselves."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from workloads.trainer.checkpoints import CheckpointDir


@dataclass
class TrainerView:
    checkpoints: CheckpointDir
    step: int = 2
    async_level: int = 1
    model_name: str = "tiny"
    public_url: str = "http://127.0.0.1:9"
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
