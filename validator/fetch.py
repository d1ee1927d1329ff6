"""Downloads of submitted files from the pool's storage, through the orchestrator's signed read
access (`GET /storage/files/{sha256}`, signed by the validator's key, which must hold the on-chain
validator role): streamed to disk, size-limited, time-limited."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from intellect.identity import Wallet
from intellect.signing import SignedAuth


class FetchError(Exception):
    """The file could not be had (yet): storage or network trouble, never proof of cheating."""


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
            grant = httpx.get(f"{self.url}/storage/files/{sha256}", auth=self.auth, timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise FetchError(f"orchestrator unreachable: {exc}") from None
        if grant.status_code != 200:
            raise FetchError(f"orchestrator answered {grant.status_code}: {grant.text[:300]}")
        url = grant.json()["url"]
        part = target.with_name(f".{target.name}.{os.getpid()}.part")
        size = 0
        try:
            with httpx.stream("GET", url, timeout=self.timeout, follow_redirects=True) as resp:
                if resp.status_code != 200:
                    raise FetchError(f"storage answered {resp.status_code} for {sha256}")
                with open(part, "wb") as out:
                    for block in resp.iter_bytes(1 << 20):
                        size += len(block)
                        if size > self.max_bytes:
                            raise FetchError(f"file {sha256} is larger than {self.max_bytes} bytes")
                        out.write(block)
        except httpx.HTTPError as exc:
            part.unlink(missing_ok=True)
            raise FetchError(f"download failed: {exc}") from None
        except FetchError:
            part.unlink(missing_ok=True)
            raise
        part.replace(target)
        return target
