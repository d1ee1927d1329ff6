from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePosixPath
from typing import Protocol

from intellect.wire.storage import UploadGrant


class StorageError(Exception):
    """A refused upload or download; `status` is the HTTP code to answer with."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    sha256: str  # "" when the store keeps no checksum for the object

    def matches(self, size: int, sha256: str) -> bool:
        """Is this the object that was granted? An upload only completes (and earns work) if so; a
        store that does not enforce the signed length/checksum itself is still checked here."""
        return self.size == size and (not self.sha256 or self.sha256 == sha256)


def object_key(name: str) -> str:
    """A safe object key from a rendered file name: relative, no '..', no empty parts."""
    path = PurePosixPath(name)
    raw_parts = name.split("/")
    if path.is_absolute() or not path.parts or any(p in ("..", ".", "") for p in raw_parts):
        raise StorageError(f"file name {name!r} must be a relative path without '.' or '..' parts")
    if any(ch in name for ch in "\\\x00\n\r?#"):
        raise StorageError(f"file name {name!r} contains a forbidden character")
    return str(path)


class StorageBackend(Protocol):
    def grant_put(
        self, key: str, upload_id: str, size: int, sha256: str, expires_at: datetime
    ) -> UploadGrant: ...

    def grant_get(self, key: str, expires_at: datetime) -> str: ...

    def stat(self, key: str) -> ObjectInfo | None: ...
