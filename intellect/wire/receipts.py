"""A group batch's receipt: who served which layers of one batch, the units each is paid for, and the
commitments of what each member received and sent.

Every member of a pipeline group writes the same receipt into its own file of the batch (`receipt`,
naming the file's own `stage`), and the batch's judge checks it against the file (the layers are the
task's split, the units its crediting rule, the digests those of the signed link records). The receipt
lives here, in the shared wire, because it is read on both sides of a layer: the workload writes and
judges it, the pool owner's `intellect-pool audit --group` (in `ledger`, which imports no workload) reads
it from the files and joins each member's file with what the chain recorded and paid for it.

A file is read for its receipt alone (`read_receipt`): bounded in size before it is parsed, every other
field of the file ignored, so the audit depends on this model and on nothing else of the file format.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from intellect.wire.base import TooLarge, first_error, read_capped

RECEIPT_FORMAT = "intellect-group-receipt/1"
MAX_RECEIPT_FILE_BYTES = 64 * 1024 * 1024  # a group batch file, frames included (workloads' own cap)
_SHA = r"^([0-9a-f]{64})?$"
NODE_ADDRESS = r"^0x[0-9a-fA-F]{40}$"  # what a member must name itself to be stated (and paid)


class ReceiptError(ValueError):
    """A file that carries no readable receipt; `str()` says why."""


class StageReceipt(BaseModel):
    """One member's part of the batch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: int = Field(ge=0, le=63)
    node: str = Field(pattern=NODE_ADDRESS)
    layers: tuple[int, int] = Field(description="[first, stop) of the model's layers it ran")
    units: int = Field(ge=0, description="the work units its file is worth (what it is paid for)")
    received_sha256: str = Field(
        pattern=_SHA, description="the receiver's digest of the frames it got (empty: stage 0, whose input "
        "is the batch's own tokens, or a file without link records)",
    )
    sent_sha256: str = Field(
        pattern=_SHA, description="the sender's digest of the frames it sent (empty: the last stage, whose "
        "tokens go back to stage 0 uncommitted, or a file without link records)",
    )


class GroupReceipt(BaseModel):
    """The batch's receipt as one member's file states it (`stage`: that member)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: str = Field(RECEIPT_FORMAT, pattern=r"^intellect-group-receipt/1$")
    task_id: str = Field(max_length=200)
    group_id: str = Field(max_length=200)
    batch: int = Field(ge=1)
    model: str = Field(max_length=500)
    model_layers: int = Field(ge=1, le=100_000)
    output_tokens: int = Field(ge=0)
    stage: int = Field(ge=0, le=63, description="the stage of the member whose file this is")
    members: list[StageReceipt] = Field(min_length=1, max_length=64)

    @model_validator(mode="after")
    def _one_ring(self) -> GroupReceipt:
        if [m.stage for m in self.members] != list(range(len(self.members))):
            raise ValueError("members must be listed by stage, 0 first, each once")
        if not self.stage < len(self.members):
            raise ValueError(f"stage {self.stage} of {len(self.members)} members")
        edge = 0
        for m in self.members:
            if m.layers[0] != edge or m.layers[1] <= m.layers[0]:
                raise ValueError(f"stage {m.stage}'s layers {list(m.layers)} do not follow layer {edge}")
            edge = m.layers[1]
        if edge != self.model_layers:
            raise ValueError(f"the stages' layers end at {edge}, the model has {self.model_layers}")
        return self

    @property
    def own(self) -> StageReceipt:
        return self.members[self.stage]

    def batch_key(self) -> tuple[str, str, int, tuple[str, ...]]:
        """What names the batch the receipt is of: the task, the group, the number and its members."""
        return self.task_id, self.group_id, self.batch, tuple(m.node.lower() for m in self.members)

    def shared(self) -> GroupReceipt:
        """The receipt without the file's own stage: what every member's file of the batch must agree on."""
        return self.model_copy(update={"stage": 0})


class _ReceiptFile(BaseModel):
    """Any file carrying a group receipt; everything else in it is ignored."""

    model_config = ConfigDict(extra="ignore")

    receipt: GroupReceipt


def read_receipt(path: Path, max_bytes: int = MAX_RECEIPT_FILE_BYTES) -> tuple[GroupReceipt, str]:
    """(the file's receipt, the file's sha256: its work key on chain). Raises `ReceiptError`."""
    try:
        raw = read_capped(path, max_bytes, "a group batch")
    except (OSError, TooLarge) as exc:
        raise ReceiptError(f"{path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        found = _ReceiptFile.model_validate_json(raw)
    except ValidationError as exc:
        reason = first_error(exc)
        hint = " (a group batch file of format 4 on carries one)" if reason.startswith("receipt:") else ""
        raise ReceiptError(f"{path}: no group receipt: {reason}{hint}") from None
    return found.receipt, hashlib.sha256(raw).hexdigest()
