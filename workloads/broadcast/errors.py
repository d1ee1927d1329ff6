"""One exception class per kind of failure, each with a message a user can act on.

They all derive from `BroadcastError` so a caller (the inference workload, the CLI) can catch the
family once and still tell a missing version from a corrupt one.
"""

from __future__ import annotations


class BroadcastError(RuntimeError):
    """Base of every broadcast failure."""


class InvalidManifest(BroadcastError):
    """A manifest that does not describe a consistent sharding of one file."""


class PublishError(BroadcastError):
    """The origin could not publish a file (missing, unreadable, or conflicting with a version)."""


class VersionNotFound(BroadcastError):
    """No source holds the requested version (not published yet, or already pruned)."""


class ManifestMismatch(BroadcastError):
    """The manifest a source gave does not match what the caller expected (other sha256, size)."""


class ShardCorrupt(BroadcastError):
    """A shard failed its sha256 check from every source it was tried on: the version is dropped."""


class ShardUnavailable(BroadcastError):
    """A shard could not be fetched from any source within the attempt budget (network, 404, 503)."""


class ChecksumMismatch(BroadcastError):
    """The assembled file's whole-file hash differs from the manifest: the file is deleted, never kept."""
