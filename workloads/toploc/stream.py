"""Proofs built while a batch is still decoding.

A chunk proof covers 32 decode positions of one sequence, so chunk j of every sequence still
decoding is final as soon as step 32(j + 1) has run.  `ProofStream` takes those blocks as they
complete and proves them on a background thread (torch.topk and numpy release the GIL), so on a
multi-core host proof building overlaps decoding instead of following it.  `finish` proves what
is left (full chunks not streamed, last partial chunks) and returns the same bytes as
`build_proofs_batch` on the whole hidden states.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from workloads.toploc.codec import encode_rows
from workloads.toploc.core import as_bf16, prove_points, top_points
from workloads.toploc.proof import CHUNK_SIZE, TOPK, build_proofs_batch


class ProofStream:
    """Collects finished chunks of a decoding batch; proves them in the background."""

    def __init__(self, chunk_size: int = CHUNK_SIZE, topk: int = TOPK, background: bool = True) -> None:
        self.chunk_size, self.topk = chunk_size, topk
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toploc") if background else None
        self._jobs: list[tuple[int, list[int], Future[list[bytes]] | list[bytes]]] = []

    def add_chunk(self, chunk: int, rows: Sequence[int], block: torch.Tensor) -> None:
        """Chunk number `chunk` of the sequences `rows`: block [len(rows), chunk_size, hidden].

        Chunks of a sequence must arrive in order 0, 1, 2, ... (a sequence that stopped is left out
        of later chunks); `finish` proves the rest.
        """
        if block.dim() != 3 or block.shape[0] != len(rows) or block.shape[1] != self.chunk_size:
            raise ValueError(
                f"block must be [rows={len(rows)}, {self.chunk_size}, hidden], got {tuple(block.shape)}"
            )
        if not rows:
            return
        flat = as_bf16(block.detach()).reshape(len(rows), -1)
        work = self._pool.submit(self._prove, flat) if self._pool else self._prove(flat)
        self._jobs.append((chunk, list(rows), work))

    def _prove(self, flat: torch.Tensor) -> list[bytes]:
        return encode_rows(*prove_points(*top_points(flat, self.topk)))

    def finish(self, hiddens: Sequence[torch.Tensor]) -> list[bytes]:
        """Proofs of every sequence, given its decode hidden states [positions, hidden]."""
        streamed: list[dict[int, bytes]] = [{} for _ in hiddens]
        try:
            for chunk, rows, work in self._jobs:
                proofs = work.result() if isinstance(work, Future) else work
                for row, proof in zip(rows, proofs, strict=True):
                    streamed[row][chunk] = proof
        finally:
            self.close()
        done = []
        for row, got in enumerate(streamed):
            count = len(got)
            if sorted(got) != list(range(count)):
                raise ValueError(f"sequence {row}: streamed chunks {sorted(got)} are not 0..{count - 1}")
            if count * self.chunk_size > hiddens[row].shape[0]:
                raise ValueError(
                    f"sequence {row}: {count} chunks streamed but only {hiddens[row].shape[0]} positions"
                )
            done.append(count)
        rest = build_proofs_batch(
            [h[n * self.chunk_size :] for h, n in zip(hiddens, done, strict=True)],
            self.chunk_size,
            self.topk,
            parallel=False,  # the decoder may be running on other threads
        )
        return [
            b"".join(got[c] for c in range(n)) + tail
            for got, n, tail in zip(streamed, done, rest, strict=True)
        ]

    def close(self) -> None:
        if self._pool:
            self._pool.shutdown(wait=True)
            self._pool = None
