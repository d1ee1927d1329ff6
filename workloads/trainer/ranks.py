"""The trainer's processes as PyTorch sees them: the process group, the device mesh, the few collectives
the sharded trainer needs, and the sharding itself (FSDP2, `torch.distributed.fsdp.fully_shard`).

A trainer process is a rank when torchrun started it (`WORLD_SIZE`, `RANK`, `LOCAL_RANK` and the
rendezvous in its environment); `join` reads that and nothing else, so the same code runs under
`intellect-train --nproc N` (one machine) and under a `torchrun --nnodes M` the operator starts on
several machines. gloo on CPUs, NCCL on GPUs (one GPU a rank, by local rank). Every collective has the
group's timeout: a rank that dies or hangs fails the others' next collective instead of hanging them
(torchrun's agent then stops the job, or restarts it when asked to).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import PreTrainedModel

T = TypeVar("T")
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class RankError(RuntimeError):
    """This process cannot be a rank as asked (a device missing, an environment torchrun did not set)."""


def launched_by_torchrun() -> bool:
    """torchrun (or its elastic agent) started this process as one of several ranks."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


@dataclass
class Ranks:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    mesh: DeviceMesh

    @property
    def leader(self) -> bool:
        """Rank 0: the one that reads rollouts, serves the step counter and publishes checkpoints."""
        return self.rank == 0

    def broadcast(self, value: T) -> T:
        """The leader's `value` on every rank (pickled: rows, orders, a stop); the others' is ignored."""
        box: list[T] = [value]
        dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box[0]

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        """Each key summed over the ranks (every rank passes the same keys)."""
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: dict[str, float]) -> dict[str, float]:
        """Each key's largest value over the ranks."""
        return self._reduce(values, dist.ReduceOp.MAX)

    def _reduce(self, values: dict[str, float], op: dist.ReduceOp.RedOpType) -> dict[str, float]:
        keys = sorted(values)
        tensor = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=op)
        return dict(zip(keys, tensor.tolist(), strict=True))

    def barrier(self) -> None:
        dist.barrier()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def die_with_agent() -> None:
    """Be killed when torchrun's agent dies. The agent starts each rank in a session of its own, so a
    SIGKILL to the agent's process group (`intellect devnet down`, a supervisor) would leave the ranks
    running: rank 0 holding the step counter's port, the others waiting on it. Linux only (prctl)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getppid()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the agent died before the request took hold
        os._exit(1)


def join(device: torch.device, timeout_seconds: float) -> Ranks:
    """This process's rank in the group torchrun set up; `device`: the trainer's resolved device (a
    GPU trainer's rank takes the GPU of its local rank)."""
    die_with_agent()
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    except (KeyError, ValueError) as exc:
        raise RankError(f"not started by torchrun (RANK/WORLD_SIZE missing or bad: {exc})") from exc
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise RankError(f"local rank {local_rank} has no GPU ({torch.cuda.device_count()} seen): "
                            "start at most one rank a GPU")  # fmt: skip
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    elif device.type == "cpu":
        backend = "gloo"
    else:
        raise RankError(f"a sharded trainer runs on CPUs or CUDA GPUs, not {device}")
    if not dist.is_initialized():
        timeout = timedelta(seconds=timeout_seconds)
        store = attempt_store(rank, world, timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
    return Ranks(rank, world, local_rank, device, mesh)


def attempt_store(rank: int, world: int, timeout: timedelta) -> dist.Store:
    """The rendezvous store torchrun names (MASTER_ADDR/PORT), its keys under this attempt's prefix.
    torchrun's agent keeps one store across the restarts it makes (`--max-restarts`), and the process
    group's own keys are not per attempt: measured, a restarted rank read the dead rank 0's address
    left by the attempt before and failed to connect. The attempt number (TORCHELASTIC_RESTART_COUNT)
    keeps each attempt's keys apart."""
    try:
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError) as exc:
        raise RankError(f"not started by torchrun (MASTER_ADDR/MASTER_PORT missing or bad: {exc})") from exc
    hosted_by_agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(host, port, world, is_master=not hosted_by_agent and rank == 0, timeout=timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"intellect-trainer/attempt-{attempt}", store)


def shard(model: PreTrainedModel, mesh: DeviceMesh) -> PreTrainedModel:
    """FSDP2 over the mesh: each decoder layer its own unit (its weights gathered for its forward and
    backward, freed after), the rest (embeddings, final norm, a tied head) in the root unit. Each rank
    keeps 1/N of every weight, gradient and optimizer state between uses."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise RankError(f"{type(model).__name__} has no decoder layers at model.layers to shard")
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def load_optimizer_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """A sharded trainer's optimizer state (torch.distributed.checkpoint) read whole into one process's
    optimizer: a trainer restarted with one process resumes from a step N ranks published."""
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415
    from torch.distributed.checkpoint.state_dict import (  # noqa: PLC0415
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    state = get_optimizer_state_dict(model, optimizer)
    dcp.load({"optimizer": state}, checkpoint_id=folder, no_dist=True)
    set_optimizer_state_dict(model, optimizer, state)
