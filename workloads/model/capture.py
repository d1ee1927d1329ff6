"""Decode-step hidden states kept where the model runs, and copied to the host once per proof chunk.

TorchBackend captures the final norm's output of every decode step (the rows TOPLOC commits to). On
a GPU each row is a [batch, hidden] tensor on the device; copying each step's row to the host would
put a device-to-host transfer (and the synchronisation it implies) in every decode step. Instead the
rows stay on the device and every `chunk` steps (TOPLOC's 32 positions, so a block is exactly one
proof chunk of every row) they are stacked there and copied in ONE transfer, into pinned memory and
without blocking where the device is CUDA, so decoding goes on while the copy runs; `result` waits
for the copies once, at the end. On the CPU the same code runs and the copies are plain views.

(issue 57.6: written for the GPU, not measured on one: this project's machines have no GPU. The
chunking is tested on the CPU, tests/workloads/test_workloads_generation.py.)
"""

from __future__ import annotations

import torch

from workloads.toploc.proof import CHUNK_SIZE


class ChunkedCapture:
    def __init__(self, chunk: int = CHUNK_SIZE) -> None:
        if chunk < 1:
            raise ValueError("chunk must be >= 1")
        self.chunk = chunk
        self.pending: list[torch.Tensor] = []  # this chunk's rows, on the device
        self.blocks: list[torch.Tensor] = []  # [batch, chunk, hidden] on the host, one per full chunk
        self.copies = 0  # device-to-host transfers made
        self.steps = 0

    def add(self, rows: torch.Tensor) -> torch.Tensor | None:
        """One decode step's rows [batch, hidden]; the host block it completes, if it completes one."""
        self.pending.append(rows)
        self.steps += 1
        if len(self.pending) < self.chunk:
            return None
        return self._flush()

    def _flush(self) -> torch.Tensor:
        block = torch.stack(self.pending, dim=1)  # on the device: one kernel, then one copy
        self.pending = []
        if block.device.type == "cuda":
            host = torch.empty(block.shape, dtype=block.dtype, pin_memory=True)
            host.copy_(block, non_blocking=True)
        else:
            host = block
        self.copies += 1
        self.blocks.append(host)
        return host

    def block(self, index: int) -> torch.Tensor:
        """The host copy of chunk `index` (complete once `add` returned it; synchronised here)."""
        if torch.cuda.is_available():
            torch.cuda.current_stream().synchronize()
        return self.blocks[index]

    def result(self, batch: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
        """Every captured step, [batch, steps, hidden] on the host (an empty [batch, 0, hidden] when none)."""
        if self.pending:
            self._flush()
        if not self.blocks:
            return torch.empty((batch, 0, hidden), dtype=dtype)
        if torch.cuda.is_available():
            torch.cuda.current_stream().synchronize()  # the non-blocking copies are done
        return torch.cat(self.blocks, dim=1) if len(self.blocks) > 1 else self.blocks[0]
