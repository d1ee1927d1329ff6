"""Downloads of submitted files from the pool's storage, through the orchestrator's signed read
access (`GET /storage/files/{sha256}`, signed by the validator's key, which must hold the on-chain
validator role): streamed to disk, size-limited, time-limited.

Two kinds of failure, because they are judged differently (validator/judging.py):
- `FileMissing`: the orchestrator answered that no upload of this file was ever completed. An honest
  worker uploads before it submits on chain, so a file still missing after the availability window
  was withheld: the node's fault.
- `StorageUnreachable` (and every other `FetchError`): the orchestrator or the storage could not be
  reached, refused this validator, or lost a file it had recorded as uploaded. Never the node's fault.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import httpx

from intellect.http_client import shared as http_client
from intellect.identity import Wallet
from intellect.signing import SignedAuth


class FetchError(Exception):
    """The file could not be had (yet)."""


class FileMissing(FetchError):
    """The orchestrator has no completed upload of this file: it was never uploaded (so far)."""


class FileTooLarge(FetchError):
    """The file is bigger than this validator reads (`max_file_bytes`): the node made it so, and no
    retry changes it. Never "storage unreachable": that would let a node skip a counter unheld."""


class StorageUnreachable(FetchError):
    """Storage or the orchestrator could not be reached or answered with an error: not the node's fault."""


class Fetcher:
    def __init__(
        self, orchestrator_url: str, wallet: Wallet, files_dir: Path, *, max_bytes: int, timeout: float
    ):
        self.url = orchestrator_url.rstrip("/")
        self.auth = SignedAuth(wallet)
        self.files_dir = files_dir
        self.max_bytes = max_bytes
        self.timeout = timeout
        files_dir.mkdir(parents=True, exist_ok=True)

    def path_for(self, sha256: str) -> Path:
        return self.files_dir / f"{sha256}.parquet"

    def fetch(self, sha256: str) -> Path:
        target = self.path_for(sha256)
        if target.exists():
            return target
        try:
            grant = http_client().get(f"{self.url}/storage/files/{sha256}", auth=self.auth,
                                      timeout=self.timeout)  # fmt: skip
        except httpx.HTTPError as exc:
            raise StorageUnreachable(f"orchestrator unreachable: {exc}") from None
        if grant.status_code == 404:
            raise FileMissing(f"no completed upload: {grant.text[:300]}")
        if grant.status_code != 200:
            raise StorageUnreachable(f"orchestrator answered {grant.status_code}: {grant.text[:300]}")
        url = grant.json()["url"]
        # per process and thread: the judge loop downloads ahead on a thread pool
        part = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.part")
        size = 0
        try:
            with http_client().stream("GET", url, timeout=self.timeout, follow_redirects=True) as resp:
                if resp.status_code != 200:  # recorded as uploaded, so a 404 here is storage's loss
                    raise StorageUnreachable(f"storage answered {resp.status_code} for {sha256}")
                with open(part, "wb") as out:
                    for block in resp.iter_bytes(1 << 20):
                        size += len(block)
                        if size > self.max_bytes:
                            raise FileTooLarge(f"file {sha256} is larger than {self.max_bytes} bytes")
                        out.write(block)
        except httpx.HTTPError as exc:
            part.unlink(missing_ok=True)
            raise StorageUnreachable(f"download failed: {exc}") from None
        except FetchError:
            part.unlink(missing_ok=True)
            raise
        part.replace(target)
        return target
