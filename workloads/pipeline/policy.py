"""Which weights a group's batch is made with, and each member's stage of them.

In an RL run the policy moves: the trainer publishes a checkpoint per step (through the broadcast
relays), and rollouts may come from a policy at most `async_level` steps old. A group follows it as one
node does (workloads/inference/workload.py), with one difference: the choice is the driver's alone
(stage 0 reads the trainer's step and picks the newest checkpoint it can have), it travels in each
batch's step-0 header (`Policy`), and every member loads *that* checkpoint's layers before the batch
runs, so all stages of one batch are of one policy. A member that cannot have the checkpoint (not on
its relay yet, or a file whose sha256 is not the one the driver named) drops the batch
(`PolicyUnavailable`, exit 3): the group runs again and the batch is redone; nothing is written.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import httpx
import structlog

from intellect.http_client import shared as http_client
from workloads.inference.checkpoints import CheckpointError, CheckpointStore
from workloads.model.loading import base_checkpoint_sha256
from workloads.pipeline.member import Policy
from workloads.pipeline.stages import Stage, StagePlan, load_stage

log = structlog.get_logger(__name__)


class PolicyUnavailable(RuntimeError):
    """This member cannot load the batch's checkpoint; `str()` says why."""


class PolicySettings(Protocol):
    @property
    def model(self) -> str: ...
    @property
    def step_url(self) -> str | None: ...
    @property
    def checkpoint_source(self) -> str | None: ...
    @property
    def checkpoint_cache(self) -> Path: ...
    @property
    def async_level(self) -> int: ...
    @property
    def poll_seconds(self) -> float: ...


class Policies:
    def __init__(self, settings: PolicySettings, wait_seconds: float = 30.0) -> None:
        self.s = settings
        self.wait_seconds = wait_seconds  # the driver's longest wait for a checkpoint before a batch
        source, keep = settings.checkpoint_source, settings.async_level + 1
        self.store = CheckpointStore(source, settings.checkpoint_cache, keep) if source else None
        self.base_sha256 = base_checkpoint_sha256(settings.model)

    def trainer_step(self) -> int:
        if not self.s.step_url:
            return 0
        response = http_client().get(self.s.step_url, timeout=10.0)
        response.raise_for_status()
        step = response.json().get("step")
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"step counter at {self.s.step_url} answered {response.text[:200]!r}")
        return step

    def choose(self) -> Policy:
        """The driver's choice for its next batch: the trainer's step and the newest checkpoint within
        the async level that can be had. Waits (polling) while none can; PolicyUnavailable after
        `wait_seconds`, so the members waiting on this batch are not left to time out unexplained."""
        deadline = time.monotonic() + self.wait_seconds
        while True:
            try:
                step = self.trainer_step()
                found = self._newest(step)
            except (httpx.HTTPError, ValueError, CheckpointError) as exc:
                found, step = None, -1
                log.warning("trainer or checkpoint source unreachable", error=str(exc))
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise PolicyUnavailable(f"no checkpoint within {self.s.async_level} steps of the trainer's "
                                        f"step {step} could be had in {self.wait_seconds:.0f} s")  # fmt: skip
            time.sleep(self.s.poll_seconds)

    def after(self, step: int, patience: float) -> Policy:
        """The driver made its share of batches for `step`: a policy for a later step as soon as the
        trainer moves on, or, after `patience` seconds, for the current one (the trainer may still
        lack informative rows; a pool must not stall on it)."""
        deadline = time.monotonic() + patience
        while True:
            policy = self.choose()
            if policy.step > step or time.monotonic() >= deadline:
                return policy
            time.sleep(self.s.poll_seconds)

    def _newest(self, step: int) -> Policy | None:
        if self.store is None:
            return Policy(step, 0, self.base_sha256)
        for candidate in range(step, max(0, step - self.s.async_level) - 1, -1):
            if candidate == 0:
                return Policy(step, 0, self.base_sha256)
            if self.store.fetch(candidate) is not None:
                return Policy(step, candidate, self.store.sha256(candidate))
        return None

    def stage(self, plan: StagePlan, policy: Policy) -> Stage:
        """This member's layers of the batch's checkpoint, its sha256 checked against the driver's."""
        if policy.checkpoint_step == 0:
            if policy.checkpoint_sha256 != self.base_sha256:
                raise PolicyUnavailable(f"the batch names base weights {policy.checkpoint_sha256}, this "
                                        f"member's are {self.base_sha256}")  # fmt: skip
            return load_stage(self.s.model, plan)
        if self.store is None:
            raise PolicyUnavailable(f"the batch needs the checkpoint of step {policy.checkpoint_step} and "
                                    "this member has no checkpoint source")  # fmt: skip
        try:
            path = self.store.fetch(policy.checkpoint_step)
        except CheckpointError as exc:
            raise PolicyUnavailable(str(exc)) from None
        if path is None:
            raise PolicyUnavailable(f"no checkpoint of step {policy.checkpoint_step} from "
                                    f"{self.s.checkpoint_source} yet")  # fmt: skip
        got = self.store.sha256(policy.checkpoint_step)
        if got != policy.checkpoint_sha256:
            raise PolicyUnavailable(f"checkpoint of step {policy.checkpoint_step}: sha256 {got}, the driver "
                                    f"named {policy.checkpoint_sha256}")  # fmt: skip
        log.info("stage loaded", stage=plan.index, checkpoint_step=policy.checkpoint_step, step=policy.step)
        return load_stage(self.s.model, plan, weights=path)
