"""The training loop: collect validated rollouts for the current step, take one GRPO step, write the
next checkpoint, advance the step counter.

A step s consumes rollouts generated for steps s − async_level … s (older files are skipped and
counted as stale; files for a later step wait). Groups with no reward spread are dropped (counted).
A group counts as informative when its task rewards differ (the length penalty alone is no signal).
Old logprobs are recomputed by the current policy at the start of the step, reference logprobs by
the frozen base model. The mean task reward of *every* row collected for a step (informative or
not) is the step's point on the reward curve.
"""

from __future__ import annotations

import os
import random
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import structlog
import torch
from prometheus_client import CollectorRegistry, Counter, Gauge
from transformers import PreTrainedModel

from intellect.device import resolve_device, train_autocast
from workloads.model.loading import load_model, load_tokenizer
from workloads.rollouts import BatchInfo, Rollout, RolloutSchemaError, read_rollouts
from workloads.trainer.checkpoints import CheckpointDir, config_hash
from workloads.trainer.grpo import (
    GrpoConfig,
    grpo_loss,
    informative_groups,
    make_batch,
    token_logprobs_and_entropy,
)
from workloads.trainer.settings import TrainerSettings
from workloads.trainer.sources import RolloutFile, RolloutSource

log = structlog.get_logger(__name__)


def read_batch(path: Path) -> tuple[list[Rollout], BatchInfo] | None:
    """A rollout file's rows, or a pipeline group's batch (JSON, `workloads/pipeline/files.py`) as rows.
    Every member of a group uploads its own copy of a batch and each copy is accepted and listed, so
    only stage 0's copy is read (None for the others): a batch is trained on once."""
    with open(path, "rb") as f:
        head = f.read(1)
    if head == b"{":
        from workloads.pipeline.files import read_group_file  # noqa: PLC0415 (only for group batches)

        data = read_group_file(path)
        return data.to_rollouts() if data.stage == 0 else None
    return read_rollouts(path)


@dataclass
class Collected:
    rows: list[Rollout]
    task_rewards: list[float]  # of all rows collected, informative or not


class Trainer:
    def __init__(self, settings: TrainerSettings, source: RolloutSource) -> None:
        self.s = settings
        self.source = source
        self.model_name = settings.model
        self.async_level = settings.async_level
        self.public_url = settings.public_url or f"http://{settings.host}:{settings.port}"
        torch.manual_seed(settings.seed)
        self.device = resolve_device(settings.device)  # CUDA asked where there is none: refused here
        # fp32 master weights on every device (see intellect/device.py); bf16 autocast on a GPU.
        self.policy = self.place(load_model(settings.model, dtype=torch.float32, device=self.loads_on()))
        self.reference = load_model(settings.model, dtype=torch.float32, device=self.loads_on())
        self.reference.requires_grad_(False)
        self.reference = self.place(self.reference)
        self.tokenizer = load_tokenizer(settings.model)
        self.pad = int(self.tokenizer.pad_token_id)
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=settings.lr, weight_decay=settings.weight_decay
        )
        self.grpo = GrpoConfig(settings.epsilon, settings.delta, settings.kl_coef, settings.entropy_coef)
        # Checkpoints that files still waiting for judgement may name stay (and stay served) until those
        # files' vote window has passed: workloads/trainer/checkpoints.py, CheckpointDir.kept_until.
        window = settings.vote_window_seconds or None
        self.checkpoints = CheckpointDir(settings.output_dir, settings.keep, vote_window=window,
                                         async_level=settings.async_level)  # fmt: skip
        # The device as resolved ("cpu", "cuda:0"), not the setting: "auto" says nothing of where it ran.
        # Not what is learned: how it is served, and over how many processes (equal within tolerance).
        serving = {"host", "port", "public_url", "max_steps", "vote_window_seconds", "nproc", "max_restarts",
                   "collective_timeout_seconds"}  # fmt: skip
        hashed = settings.model_dump(exclude=serving)
        self.config_hash = config_hash(hashed | {"device": str(self.device)})
        self.step = 0
        self.consumed: set[str] = set()
        self.pending_files: list[RolloutFile] = []  # files for a later step
        self.buffer = Collected([], [])
        self.step_files: list[str] = []
        self.registry = CollectorRegistry()
        self.m_step = Gauge("trainer_step", "current step", registry=self.registry)
        self.m_filtered = Counter(
            "trainer_filtered_groups_total", "zero-advantage groups dropped", registry=self.registry
        )
        self.m_stale = Counter(
            "trainer_stale_files_total", "files older than the async level", registry=self.registry
        )
        self.m_bad = Counter(
            "trainer_rejected_files_total", "files failing the schema check", registry=self.registry
        )
        self.m_tokens = Counter("trainer_tokens_total", "output tokens trained on", registry=self.registry)
        self.m_reward = Gauge(
            "trainer_task_reward_mean", "mean task reward of the last step", registry=self.registry
        )
        self.resume()

    def close(self) -> None:
        """Nothing to let go of in one process (a sharded trainer leaves its process group)."""

    def loads_on(self) -> torch.device:
        """Where the weights are read to: the training device (a sharded trainer: the host, `place`
        moving each unit to the device as it shards it)."""
        return self.device

    def place(self, model: PreTrainedModel) -> PreTrainedModel:
        """Where a loaded model lives: whole in this process (a sharded trainer shards it here)."""
        return model

    # ---- state ---------------------------------------------------------------------------------
    def resume(self) -> None:
        steps = self.checkpoints.resumable()
        if not steps:
            return
        last = steps[-1]
        self.checkpoints.load_weights(self.policy, last)
        state = self.checkpoints.load_state(last)
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        else:  # published by a sharded trainer: its optimizer state in shards, read whole here
            from workloads.trainer.ranks import load_optimizer_shards  # noqa: PLC0415

            load_optimizer_shards(self.policy, self.optimizer, self.checkpoints.optimizer_dir(last))
        self.consumed = set(state["consumed"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        self.step = last
        self.m_step.set(last)
        log.info("resumed", step=last, consumed=len(self.consumed))

    # ---- data ----------------------------------------------------------------------------------
    def collect(self) -> None:
        fresh = self.pending_files + self.source.new_files(
            self.consumed | {f.file_id for f in self.pending_files}
        )
        self.pending_files = []
        for f in fresh:
            try:
                read = read_batch(f.path)
            except (RolloutSchemaError, ValueError) as exc:
                self.m_bad.inc()
                self.consumed.add(f.file_id)
                log.warning("rollout file refused", file=str(f.path), error=str(exc))
                continue
            if read is None:  # another member's copy of a group batch: its driver's copy is trained on
                self.consumed.add(f.file_id)
                continue
            rows, info = read
            if info.step > self.step:
                self.pending_files.append(f)
                continue
            self.consumed.add(f.file_id)
            if info.step < self.step - self.async_level:
                self.m_stale.inc()
                continue
            if info.group_size != self.s.group_size or len(rows) % info.group_size:
                self.m_bad.inc()
                log.warning(
                    "rollout file has another group size", file=str(f.path), group_size=info.group_size
                )
                continue
            # A group whose task rewards are all equal carries no signal: its advantages come from the
            # length penalty alone, which the group's tiny std would blow up to ±1 (noise, not skill).
            keep = informative_groups(np.array([r.task_rewards for r in rows]), info.group_size)
            self.m_filtered.inc(int((~keep).sum()))
            self.buffer.task_rewards.extend(r.task_rewards for r in rows)
            for g, useful in enumerate(keep):
                if useful:
                    self.buffer.rows.extend(rows[g * info.group_size : (g + 1) * info.group_size])
            self.step_files.append(f.file_id)

    def ready(self) -> bool:
        return len(self.buffer.rows) >= self.s.rows_per_step

    # ---- training ------------------------------------------------------------------------------
    def take_rows(self) -> tuple[list[Rollout], list[float]]:
        """The step's rows and the task rewards of every row seen for it. Every informative row collected
        for this step trains it; nothing is carried over to the next step, where it would be one policy
        older again (off-policy drift)."""
        rows, self.buffer.rows = self.buffer.rows, []
        rewards_seen, self.buffer.task_rewards = self.buffer.task_rewards, []
        return rows, rewards_seen

    def train_step(self) -> dict[str, float]:
        rows, rewards_seen = self.take_rows()
        order = torch.randperm(len(rows))  # on the CPU generator (saved with the state) on every device
        return self.train_on(rows, rewards_seen, order)

    def train_on(
        self, rows: list[Rollout], rewards_seen: list[float], order: torch.Tensor
    ) -> dict[str, float]:
        """One GRPO step over `rows`, its updates taking the rows in `order` (minibatches of its chunks)."""
        started = time.perf_counter()
        batch = make_batch([r.input_tokens for r in rows], [r.output_tokens for r in rows],
                           [r.advantages for r in rows], self.pad, self.device)  # fmt: skip
        # The policy as it is at the start of the step, and the reference.
        with torch.no_grad(), train_autocast(self.device):
            self.policy.eval()
            old_logp, _ = token_logprobs_and_entropy(self.policy, batch)
            ref_logp, _ = token_logprobs_and_entropy(self.reference, batch)
        self.policy.train()
        parts: dict[str, float] = {}
        updates = self.updates_for(len(rows))
        for cpu_chunk in order.chunk(updates):
            chunk = cpu_chunk.to(self.device)
            sub = type(batch)(batch.ids[chunk], batch.output_mask[chunk], batch.advantages[chunk])
            with train_autocast(self.device):
                logp, entropy = token_logprobs_and_entropy(self.policy, sub)
                loss, parts = grpo_loss(logp, old_logp[chunk], ref_logp[chunk], entropy, sub.advantages,
                                        sub.output_mask, self.grpo)  # fmt: skip
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            parts["grad_norm"] = float(
                torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.s.grad_clip)
            )
            self.optimizer.step()
        return self.finish(parts, rows, rewards_seen, int(batch.output_mask.sum()), updates, started)

    def finish(
        self, parts: dict[str, float], rows: list[Rollout], rewards_seen: list[float], tokens: int,
        updates: int, started: float,
    ) -> dict[str, float]:  # fmt: skip
        """The step's metrics; the step published (`save`) and counted."""
        metrics = {
            **parts,
            "task_reward_mean": float(np.mean(rewards_seen)) if rewards_seen else 0.0,
            "rows": float(len(rows)),
            "rows_seen": float(len(rewards_seen)),
            "tokens": float(tokens),
            "seconds": time.perf_counter() - started,
        }
        metrics["updates"] = float(updates)
        metrics["tokens_per_second"] = tokens * updates / max(metrics["seconds"], 1e-9)
        metrics |= self.memory()
        self.save(metrics)
        self.m_tokens.inc(tokens)
        self.m_reward.set(metrics["task_reward_mean"])
        self._report(metrics)
        return metrics

    def memory(self) -> dict[str, float]:
        """MB this process holds of the policy's weights and optimizer state (a sharded trainer: its
        shard; the frozen reference counted with the weights), and its peak resident memory."""
        held: list[torch.Tensor] = [*self.policy.parameters(), *self.reference.parameters()]
        held += [v for state in self.optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
        local = [getattr(t, "to_local", lambda t=t: t)() for t in held]  # a DTensor's own shard
        state_bytes = sum(t.numel() * t.element_size() for t in local)
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux
        return {"state_mb": state_bytes / 2**20, "peak_rss_mb": peak_kb / 1024}

    def updates_for(self, rows: int) -> int:
        if not self.s.minibatch_rows:
            return self.s.updates_per_step
        return max(1, min(self.s.max_updates_per_step, -(-rows // self.s.minibatch_rows)))

    def save(self, metrics: dict[str, float]) -> None:
        state = {
            "optimizer": self.optimizer.state_dict(), "consumed": sorted(self.consumed),
            "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
        }  # fmt: skip
        self.checkpoints.save(
            self.policy, self.step + 1, self.step, self.config_hash, metrics, self.step_files, state
        )
        self.step += 1
        self.step_files = []
        self.m_step.set(self.step)
        log.info("step", step=self.step, **{k: round(v, 4) for k, v in metrics.items()})

    def _report(self, metrics: dict[str, float]) -> None:
        if not os.environ.get("INTELLECT_SOCKET_PATH"):
            return
        from workloads.bridge_client import report_metrics  # noqa: PLC0415 (only inside a task)

        report_metrics({"trainer_step": float(self.step), **{f"trainer_{k}": v for k, v in metrics.items()}})

    def run(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        while not should_stop() and (self.s.max_steps == 0 or self.step < self.s.max_steps):
            try:
                self.collect()
            except Exception as exc:  # the validator or a file unreachable: wait and try again
                log.warning("collect failed", error=str(exc))
            if self.ready():
                self.train_step()
            else:
                time.sleep(self.s.poll_seconds)
