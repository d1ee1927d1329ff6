"""The sha256 of a file, read in 1 MiB blocks: the identity of every submitted file (its work key),
checkpoint and upload, computed the same way by the workloads, the worker and the validator."""

from __future__ import annotations

import hashlib
import os


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
