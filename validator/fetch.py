"""Downloads of submitted files from the pool's storage, through the orchestrator's signed read
access (`GET /storage/files/{sha256}`, signed by the validator's key, which must hold the on-chain
validator role; validator/records.py): streamed to disk, size-limited, time-limited. That one answer
also names the file's task, remembered for the judge: one call to the orchestrator per file.

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

from intellect.client import TaskApiError
from intellect.http_client import shared as http_client
from intellect.identity import Wallet
from validator.records import for_orchestrator


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
        self.records = for_orchestrator(self.url, wallet)
        self.files_dir = files_dir
        self.max_bytes = max_bytes
        self.timeout = timeout
        files_dir.mkdir(parents=True, exist_ok=True)

    def path_for(self, sha256: str) -> Path:
        return self.files_dir / f"{sha256}.parquet"

    def _download_url(self, sha256: str) -> str:
        try:
            return self.records.record(sha256, timeout=self.timeout).url
        except TaskApiError as exc:
            if exc.status == 404:
                raise FileMissing(f"no completed upload: {exc.reason[:300]}") from None
            if exc.status == 0:
                raise StorageUnreachable(exc.reason) from None  # "cannot reach the orchestrator: ..."
            raise StorageUnreachable(f"orchestrator answered {exc.status}: {exc.reason[:300]}") from None
        except ValueError as exc:  # not a file record: the orchestrator's fault, never the node's
            raise StorageUnreachable(f"the orchestrator's answer for {sha256} is no file record: {exc}"
                                     ) from None

    def fetch(self, sha256: str) -> Path:
        target = self.path_for(sha256)
        if target.exists():
            return target
        url = self._download_url(sha256)
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
