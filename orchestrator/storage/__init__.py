"""Storage for uploaded rollout files: signed, expiring, single-use upload URLs.

`local.py` is the embedded default (local disk behind HMAC-signed URLs served by the orchestrator);
`s3.py` is the scale-out backend (presigned URLs against any S3-compatible store).
"""

from orchestrator.storage.base import ObjectInfo, StorageBackend, StorageError, object_key
from orchestrator.storage.local import LocalDiskStorage, storage_router
from orchestrator.storage.urls import UrlSigner

__all__ = [
    "LocalDiskStorage",
    "ObjectInfo",
    "StorageBackend",
    "StorageError",
    "UrlSigner",
    "object_key",
    "storage_router",
]
