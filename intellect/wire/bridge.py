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


BridgeMessage = Annotated[MetricsMessage | FileReadyMessage, Field(discriminator="type")]
bridge_message = TypeAdapter(BridgeMessage)


class BridgeReply(WireModel):
    ok: bool
    error: str | None = None
