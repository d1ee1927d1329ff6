"""Upload requests: a node asks the orchestrator for a signed URL to PUT one file."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from intellect.wire.base import WireModel


class UploadRequest(WireModel):
    task_id: str
    original_name: str = Field(min_length=1, max_length=255)
    size_bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    work_units: int = Field(ge=0)


class UploadGrant(WireModel):
    upload_id: str
    file_name: str
    url: str
    method: str = "PUT"
    headers: dict[str, str] = Field(default_factory=dict)
    expires_at: datetime


class StoredFile(WireModel):
    """Where a stored file (by its sha256 work key) can be downloaded, for validators and admins."""

    sha256: str
    file_name: str
    size_bytes: int
    work_units: int
    node_address: str
    task_id: str
    url: str
    expires_at: datetime
