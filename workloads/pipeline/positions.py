"""Where a batch's rows sit in its left-padded tensors, and what one side of a link saw at the positions
the proofs commit to. Shared by every member's decode loop (`member.py`)."""

from __future__ import annotations

import torch


class SeenRows:
    """Activations one side of a link saw, kept per row at the positions proofs commit to."""

    def __init__(self, lengths: list[int], width: int) -> None:
        self.lengths, self.width = lengths, width
        self.prompt: torch.Tensor | None = None  # [B, W, H] of step 0
        self.steps: list[torch.Tensor] = []  # [B, H] of steps 1..

    @property
    def rows(self) -> bool:
        return self.prompt is not None

    def add(self, step: int, tensor: torch.Tensor) -> None:
        if step == 0:
            self.prompt = tensor.detach().clone()
        else:
            self.steps.append(tensor[:, -1].detach().clone())

    def _decode(self, i: int, count: int) -> torch.Tensor:
        assert self.prompt is not None
        if count <= 0:
            return self.prompt.new_zeros((0, self.prompt.shape[-1]))
        return torch.stack([s[i] for s in self.steps[:count]])

    def rows_for(self, out_lengths: list[int]) -> list[torch.Tensor]:
        """Per row: every real prompt position, then the positions of its fed output tokens."""
        assert self.prompt is not None
        return [torch.cat([self.prompt[i, self.width - n :], self._decode(i, m - 1)])
                for i, (n, m) in enumerate(zip(self.lengths, out_lengths, strict=True))]  # fmt: skip

    def final(self, out_lengths: list[int]) -> list[torch.Tensor]:
        """Per row: the decode positions only (a single node's TOPLOC proof)."""
        return [self._decode(i, m - 1) for i, m in enumerate(out_lengths)]


def mask_positions(lengths: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention mask and position ids of rows of `lengths` left-padded to `width`."""
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, width - n :] = 1
    return mask, (mask.cumsum(-1) - 1).clamp_min(0)


def grow(mask: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mask and position ids of the next decode step (one more real position per row)."""
    return torch.cat([mask, torch.ones((mask.shape[0], 1), dtype=mask.dtype)], dim=1), pos[:, -1:] + 1
