"""One trip round the ring: the positions the driver feeds at once (a row's last token and its drafted
next tokens, `draft.py`), run one at a time by every stage, and how many of them count.

A trip's positions are held until the driver says how many count (`keep`, in the next frame it
sends): only then does a member commit them: to the rows its proofs are built from, to its tokens (the
last stage), and to the logs its seals sign. What it commits for a position is the frame plain decoding
would have carried for that step (`act_frame`, `tok_frame`, `end_frame`), so a member's file, its
proofs and the frames its links signed are those of a group decoding without a draft, and a validator
replays them unchanged. The positions that did not count are dropped from every stage's cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from workloads.pipeline.draft import Draft
from workloads.pipeline.positions import grow
from workloads.pipeline.transport import frame_parts


def act_frame(step: int, tensor: torch.Tensor, shape: dict[str, Any] | None = None) -> list[bytes]:
    return frame_parts({"kind": "act", "step": step, **(shape or {})}, tensor)


def tok_frame(step: int, tokens: list[int], logprobs: list[float]) -> list[bytes]:
    return frame_parts({"kind": "tok", "step": step, "tokens": tokens, "logprobs": logprobs})


def end_frame(lengths: list[int]) -> list[bytes]:
    return frame_parts({"kind": "end", "lengths": lengths})


@dataclass
class Trip:
    """What one member did in a trip from `step`, per position, until it knows how many count."""

    step: int
    sent: list[list[bytes]] = field(default_factory=list)  # the frame plain decoding would have sent
    received: list[list[bytes]] = field(default_factory=list)  # ...and received (not at stage 0)
    inputs: list[torch.Tensor] = field(default_factory=list)  # [B, 1, H] what it ran on (not at stage 0)
    payloads: list[torch.Tensor] = field(default_factory=list)  # [B, 1, H] what it sent on (not the last)
    proven: list[torch.Tensor] = field(default_factory=list)  # [B, 1, H] what its proofs commit to
    sampled: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # last: tokens, logprobs

    @property
    def positions(self) -> int:
        return len(self.proven)


def draft_inputs(last: torch.Tensor, done: list[bool], contexts: list[list[int]], draft: Draft | None,
                 k: int, eos: int, pad: int, seeds: list[int] | None = None, step: int = 0,
                 temperature: float = 1.0) -> torch.Tensor:  # fmt: skip
    """The trip's inputs [B, 1 + k']: each row's last token (pad once done), then its drafted tokens as
    they would be fed (pad after a drafted end of sequence). k' ≤ k is the fewest guesses any row still
    decoding has: the batch advances in step, so a position no row could keep is not worth running."""
    active = [i for i in range(len(done)) if not done[i]] if draft is not None and k > 0 else []
    seeds = seeds or [0] * len(done)
    proposed = draft.propose([contexts[i] for i in active], k, [seeds[i] for i in active], step,
                             temperature) if draft is not None and active else []  # fmt: skip
    guesses = {i: list(g)[:k] for i, g in zip(active, proposed, strict=True)}
    width = min((len(g) for g in guesses.values()), default=0)
    rows = []
    for i in range(len(done)):
        if done[i]:
            rows.append([pad] * (1 + width))
            continue
        fed, ended = [int(last[i])], False
        for g in guesses.get(i, [])[:width]:
            ended = ended or g == eos
            fed.append(pad if ended else int(g))
        rows.append(fed)
    return torch.tensor(rows, dtype=torch.long)


def kept(inputs: torch.Tensor, sampled: list[torch.Tensor], done: list[bool], eos: int, pad: int) -> int:
    """How many of a trip's positions count: the first always; each next one while every row was fed
    there the token it would have been fed without a draft (its token of the step before, or pad once
    that token ended it)."""
    batch, positions = inputs.shape
    keep = positions
    for i in range(batch):
        if done[i]:
            continue  # fed pad throughout, as plain decoding feeds it
        ended = False
        for j in range(positions - 1):
            token = int(sampled[j][i])
            ended = ended or token == eos
            if int(inputs[i, j + 1]) != (pad if ended else token):
                keep = min(keep, j + 1)
                break
    return keep


class Rows:
    """The batch's tokens and logprobs so far, and which rows have ended (at end of sequence)."""

    def __init__(self, batch: int, eos: int) -> None:
        self.eos = eos
        self.tokens: list[list[int]] = [[] for _ in range(batch)]
        self.logprobs: list[list[float]] = [[] for _ in range(batch)]
        self.done = [False] * batch

    @property
    def finished(self) -> bool:
        return all(self.done)

    def take(self, tok: torch.Tensor, lp: torch.Tensor) -> None:
        """One step's draw: kept for every row still decoding."""
        for i in range(len(self.done)):
            if not self.done[i]:
                self.tokens[i].append(int(tok[i]))
                self.logprobs[i].append(float(lp[i]))
                self.done[i] = int(tok[i]) == self.eos


def cut(trip: Trip, keep: int, mask: torch.Tensor, pos: torch.Tensor, cache: Any
         ) -> tuple[torch.Tensor, torch.Tensor, Any]:  # fmt: skip
    """After a trip of which `keep` positions count: the mask and positions grown by those, the cache
    without the rest (so the next step runs on exactly what plain decoding would have cached)."""
    if keep < trip.positions:
        cache.crop(-(trip.positions - keep))
    for _ in range(keep):
        mask, pos = grow(mask, pos)
    return mask, pos, cache
