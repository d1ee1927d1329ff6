"""The trainer over several processes: the policy and the reference sharded with FSDP2, one trainer to
the outside.

- **Rank 0 leads.** It alone reads the validated rollouts, decides when a step is ready and in which
  order its rows train (the one-process trainer's draw, from the same seeded generator), and sends
  that plan to every rank; between plans it sends "no step yet" every poll, so no rank waits on a
  collective longer than a poll and a collect (the group's timeout guards the rest). It alone serves
  the step counter (`__main__`) and publishes checkpoints.
- **Rows split by one rule.** Each update's minibatch is a chunk of the plan's order, as in one process;
  rank r takes the chunk's rows at positions r, r + N, r + 2N, … Every rank has the whole plan, so each
  knows every minibatch's output-token count and divides its part of the loss by it: the ranks' sums
  are the one-process loss, and FSDP's reduce-scatter averages gradients over the N ranks, so each
  rank's loss is scaled by N before backward. A rank with no row in a chunk runs one masked padding row
  (every rank must take part in every forward and backward: FSDP gathers weights collectively).
- **One checkpoint.** Each step, every rank hands in its shards: rank 0 gathers the full weights
  (`get_model_state_dict`, full and on the CPU) and writes the same safetensors, sidecar and manifest as
  one process; the optimizer state stays sharded, saved by torch.distributed.checkpoint into
  `step_<N>.optimizer/` (renamed in place only once every rank has written). The manifest comes last,
  so no reader sees a half-written step and a restart resumes from the last whole one.
- **Resume across world sizes.** The weights come from the consolidated file (rank 0 reads, broadcasts),
  the optimizer from the sharded folder, which torch.distributed.checkpoint re-splits for any N; a step
  published by a one-process trainer (its optimizer inside `state.pt`) resumes too.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable
from typing import Any

import structlog
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from transformers import PreTrainedModel

from intellect.device import train_autocast
from workloads.rollouts import Rollout
from workloads.trainer.grpo import Batch, grpo_loss, make_batch, token_logprobs_and_entropy
from workloads.trainer.loop import Trainer
from workloads.trainer.ranks import Ranks, shard
from workloads.trainer.settings import TrainerSettings
from workloads.trainer.sources import RolloutSource

log = structlog.get_logger(__name__)

Plan = tuple[list[Rollout], list[float], torch.Tensor]  # rows, task rewards seen, order
STOP = "stop"


class ShardedTrainer(Trainer):
    def __init__(self, settings: TrainerSettings, source: RolloutSource, ranks: Ranks) -> None:
        self.ranks = ranks
        super().__init__(settings.model_copy(update={"device": str(ranks.device)}), source)

    def loads_on(self) -> torch.device:
        """The host: FSDP2 moves each unit (a decoder layer, then the root's rest) to this rank's device
        as `fully_shard` shards it, so a GPU holds one unit whole at a time and 1/N of the model after,
        never the whole model (which may not fit one device: why a trainer shards at all)."""
        return torch.device("cpu")

    def place(self, model: PreTrainedModel) -> PreTrainedModel:
        return shard(model, self.ranks.mesh)

    def close(self) -> None:
        self.ranks.close()

    def memory(self) -> dict[str, float]:
        return self.ranks.max(super().memory())  # the most any rank holds

    def _report(self, metrics: dict[str, float]) -> None:
        if self.ranks.leader:  # one trainer to the outside
            super()._report(metrics)

    # ---- the loop ------------------------------------------------------------------------------
    def run(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        while True:
            message: Plan | str | None = None
            if self.ranks.leader:
                message = self._lead(should_stop)
            message = self.ranks.broadcast(message)
            if message == STOP:
                return
            if isinstance(message, tuple):
                self.train_on(*message)
            elif self.ranks.leader:
                time.sleep(self.s.poll_seconds)

    def _lead(self, should_stop: Callable[[], bool]) -> Plan | str | None:
        if should_stop() or (self.s.max_steps and self.step >= self.s.max_steps):
            return STOP
        try:
            self.collect()
        except Exception as exc:  # the validator or a file unreachable: wait and try again
            log.warning("collect failed", error=str(exc))
        if not self.ready():
            return None
        rows, rewards_seen = self.take_rows()
        # What a rank trains on, without the proofs and logprobs it never reads (sent to every rank).
        light = [r.model_copy(update={"proofs": b"", "output_logprobs": []}) for r in rows]
        return light, rewards_seen, torch.randperm(len(rows))  # the one-process trainer's draw

    # ---- one step ------------------------------------------------------------------------------
    def _rows_of(self, rows: list[Rollout], index: torch.Tensor) -> Batch:
        """This rank's rows as a batch, or one masked padding row when it has none in a chunk."""
        if not len(index):
            pad = torch.full((1, 2), self.pad, dtype=torch.long)
            return Batch(pad.to(self.device), torch.zeros((1, 2), dtype=torch.bool, device=self.device),
                         torch.zeros(1, device=self.device))  # fmt: skip
        picked = [rows[int(i)] for i in index]
        return make_batch([r.input_tokens for r in picked], [r.output_tokens for r in picked],
                          [r.advantages for r in picked], self.pad, self.device)  # fmt: skip

    def train_on(
        self, rows: list[Rollout], rewards_seen: list[float], order: torch.Tensor
    ) -> dict[str, float]:
        started = time.perf_counter()
        rank, world = self.ranks.rank, self.ranks.world
        updates = self.updates_for(len(rows))
        lengths = torch.tensor([len(r.output_tokens) for r in rows], dtype=torch.float64)
        chunks = order.chunk(updates)
        shares = [chunk[rank::world] for chunk in chunks]
        batches = [self._rows_of(rows, share) for share in shares]
        # The policy as it is at the start of the step, and the reference: for this rank's rows only.
        with torch.no_grad(), train_autocast(self.device):
            self.policy.eval()
            old = [token_logprobs_and_entropy(self.policy, b)[0] for b in batches]
            ref = [token_logprobs_and_entropy(self.reference, b)[0] for b in batches]
        self.policy.train()
        parts: dict[str, float] = {}
        for chunk, batch, old_logp, ref_logp in zip(chunks, batches, old, ref, strict=True):
            tokens = float(lengths[chunk].sum())  # the whole minibatch's, known to every rank
            with train_autocast(self.device):
                logp, entropy = token_logprobs_and_entropy(self.policy, batch)
                loss, mine = grpo_loss(logp, old_logp, ref_logp, entropy, batch.advantages, batch.output_mask,
                                       self.grpo, tokens=tokens)  # fmt: skip
            self.optimizer.zero_grad(set_to_none=True)
            (loss * world).backward()  # FSDP averages gradients over the ranks; the sum is wanted
            parts = self.ranks.sum(mine)
            norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.s.grad_clip)
            full = getattr(norm, "full_tensor", None)  # a DTensor over the mesh
            parts["grad_norm"] = float(full() if callable(full) else norm)
            self.optimizer.step()
        parts["ranks"] = float(world)
        return self.finish(parts, rows, rewards_seen, int(lengths.sum()), updates, started)

    # ---- publishing and resuming ---------------------------------------------------------------
    def save(self, metrics: dict[str, float]) -> None:
        step = self.step + 1
        whole = StateDictOptions(full_state_dict=True, cpu_offload=True)  # on rank 0's CPU, empty elsewhere
        full = get_model_state_dict(self.policy, options=whole)
        folder = self.checkpoints.optimizer_dir(step)
        writing = folder.with_suffix(".writing")
        if self.ranks.leader:  # a folder left by a run killed while writing it
            shutil.rmtree(writing, ignore_errors=True)
        self.ranks.barrier()
        dcp.save({"optimizer": get_optimizer_state_dict(self.policy, self.optimizer)}, checkpoint_id=writing)
        if self.ranks.leader:  # dcp.save returns once every rank's shard and the metadata are written
            shutil.rmtree(folder, ignore_errors=True)
            writing.replace(folder)
            state = {
                "consumed": sorted(self.consumed), "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate(), "ranks": self.ranks.world,
            }  # fmt: skip
            tied = bool(getattr(self.policy.config, "tie_word_embeddings", False))
            tensors = {k: v for k, v in full.items() if isinstance(v, torch.Tensor)}
            self.checkpoints.save_tensors(tensors, tied, step, self.step, self.config_hash, metrics,
                                          self.step_files, state)  # fmt: skip
        self.ranks.barrier()  # no rank runs ahead of a step not yet published
        self.step = step
        self.step_files = []
        self.m_step.set(self.step)
        if self.ranks.leader:
            log.info("step", step=self.step, **{k: round(v, 4) for k, v in metrics.items()})

    def resume(self) -> None:
        steps = self.checkpoints.resumable() if self.ranks.leader else []
        last = self.ranks.broadcast(steps[-1] if steps else 0)
        if not last:
            return
        weights: dict[str, Any] = {}
        state: dict[str, Any] = {}
        if self.ranks.leader:
            from safetensors.torch import load_file  # noqa: PLC0415

            weights = load_file(str(self.checkpoints.weights(last)))
            if "lm_head.weight" not in weights and "model.embed_tokens.weight" in weights:
                weights["lm_head.weight"] = weights["model.embed_tokens.weight"]  # tied: saved once
            state = self.checkpoints.load_state(last)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(self.policy, weights, options=options)
        if self.ranks.broadcast(self.checkpoints.optimizer_dir(last).is_dir() if self.ranks.leader else None):
            optimizer = get_optimizer_state_dict(self.policy, self.optimizer)
            dcp.load({"optimizer": optimizer}, checkpoint_id=self.checkpoints.optimizer_dir(last))
            set_optimizer_state_dict(self.policy, self.optimizer, optimizer)
        else:  # published by one process: its optimizer state, whole, keyed by parameter number
            whole = by_name(self.policy, state["optimizer"]) if self.ranks.leader else {}
            set_optimizer_state_dict(self.policy, self.optimizer, whole, options=options)
        if self.ranks.leader:
            self.consumed = set(state["consumed"])
            torch.set_rng_state(state["torch_rng"])
            random.setstate(state["python_rng"])
        self.step = last
        self.m_step.set(last)
        if self.ranks.leader:
            log.info("resumed", step=last, consumed=len(self.consumed), ranks=self.ranks.world)


def by_name(model: torch.nn.Module, saved: dict[str, Any]) -> dict[str, Any]:
    """A one-process optimizer state dict (parameters numbered in `model.parameters()` order) keyed by
    parameter name instead, as torch.distributed's full optimizer state dicts are."""
    names = [name for name, _ in model.named_parameters()]
    groups = []
    for group in saved["param_groups"]:
        groups.append({**group, "params": [names[i] for i in group["params"]]})
    return {"state": {names[i]: value for i, value in saved["state"].items()}, "param_groups": groups}
