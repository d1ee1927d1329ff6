"""Task bridge messages: one JSON object per line over the worker's unix socket."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from intellect.wire.base import WireModel


class MetricsMessage(WireModel):
    type: Literal["metrics"] = "metrics"
    task_id: str
    metrics: dict[str, float]


class FileReadyMessage(WireModel):
    type: Literal["file_ready"] = "file_ready"
    task_id: str
    path: str = Field(description="path inside the task's data directory")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    work_units: int = Field(ge=0)


LINK_DOMAIN = "intellect-pipeline-link/1"


class SignLinkMessage(WireModel):
    """A group member asks its worker to sign, with the node's key, what crossed one of its links in one
    batch: the sha256 of the frames it sent (`role` "sent") or received ("received"). The node key never
    enters the task; the worker signs only this fixed text (`claim_text`), which names the task, group,
    batch and link, so a task cannot have the key sign anything else (a transaction, a request)."""

    type: Literal["sign_link"] = "sign_link"
    task_id: str = Field(min_length=1, max_length=200)
    group_id: str = Field(min_length=1, max_length=200)
    batch: int = Field(ge=1)
    sender: int = Field(ge=0, le=63)
    receiver: int = Field(ge=0, le=63)
    role: Literal["sent", "received", "shape"]  # "shape": the driver's word on a batch's step 0
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    def claim_text(self) -> str:
        return claim_text(self.task_id, self.group_id, self.batch, self.sender, self.receiver, self.role,
                          self.sha256)  # fmt: skip


def claim_text(task_id: str, group_id: str, batch: int, sender: int, receiver: int, role: str,
               sha256: str) -> str:  # fmt: skip
    """The exact text a member's node key signs for one link of one batch (EIP-191 personal_sign)."""
    return (f"{LINK_DOMAIN}\ntask {task_id}\ngroup {group_id}\nbatch {batch}\n"
            f"link {sender}->{receiver}\n{role} {sha256}")  # fmt: skip


BridgeMessage = Annotated[MetricsMessage | FileReadyMessage | SignLinkMessage, Field(discriminator="type")]
bridge_message = TypeAdapter(BridgeMessage)


class BridgeReply(WireModel):
    ok: bool
    error: str | None = None
    signature: str | None = None  # `sign_link`: the node key's signature, 0x-prefixed hex
