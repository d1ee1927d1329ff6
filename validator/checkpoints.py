"""Checkpoints as the trainer publishes them: its step counter (`GET /step`) lists, for each step a
worker may still use, the checkpoint's URL and sha256. Step 0, the base model, is the judge's to
resolve when the trainer lists none (`workloads.model.loading.ModelCheckpoints`). Files are fetched
once, verified, and cached by sha256: the newest `keep` steps' files (default 16; the trainer keeps 5
on disk and lists only those its async level still allows, so an older one could not be fetched again
anyway, and a validator that lags more than that gives such files a soft verdict), so a long run does
not fill the validator's disk with every checkpoint it ever saw."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import httpx

from intellect.digests import sha256_file
from intellect.http_client import shared as http_client


class FileCheckpoints:
    """Checkpoints given on `intellect-validator check`'s command line (`--checkpoint STEP=PATH`)."""

    def __init__(self, steps: dict[int, Path] | None = None) -> None:
        self.steps = {k: Path(v) for k, v in (steps or {}).items()}
        self._sha: dict[int, str] = {}

    def checkpoint_for(self, step: int) -> tuple[Path, str] | None:
        if step not in self.steps:
            return None
        if step not in self._sha:
            self._sha[step] = sha256_file(self.steps[step])
        return self.steps[step], self._sha[step]


class TrainerCheckpoints:
    """One per validator, shared by every task's judge (judged on several threads: one fetch at a time)."""

    def __init__(self, step_url: str, cache_dir: Path, timeout: float = 60.0, keep: int = 16) -> None:
        self.step_url = step_url
        self.keep = max(1, keep)
        self.cache_dir = cache_dir
        self.timeout = timeout
        self._lock = threading.Lock()
        self.known: dict[int, tuple[str, str]] = {}  # step -> (url, sha256), remembered once seen
        cache_dir.mkdir(parents=True, exist_ok=True)

    def _refresh(self) -> None:
        try:
            body = http_client().get(self.step_url, timeout=self.timeout).json()
        except (httpx.HTTPError, ValueError):
            return
        for step, entry in (body.get("checkpoints") or {}).items():
            if isinstance(entry, dict) and entry.get("url") and entry.get("sha256"):
                self.known[int(step)] = (str(entry["url"]), str(entry["sha256"]).lower())

    def checkpoint_for(self, step: int) -> tuple[Path, str] | None:
        with self._lock:
            return self._checkpoint_for(step)

    def _checkpoint_for(self, step: int) -> tuple[Path, str] | None:
        if step not in self.known:
            self._refresh()
        if step not in self.known:
            return None
        url, sha = self.known[step]
        target = self.cache_dir / f"{sha}.safetensors"
        if not target.exists():
            part = target.with_suffix(".part")
            digest = hashlib.sha256()
            try:
                with http_client().stream("GET", url, timeout=self.timeout, follow_redirects=True) as resp:
                    resp.raise_for_status()
                    with open(part, "wb") as out:
                        for block in resp.iter_bytes(1 << 20):
                            digest.update(block)
                            out.write(block)
            except httpx.HTTPError:
                part.unlink(missing_ok=True)
                return None
            if digest.hexdigest() != sha:
                part.unlink(missing_ok=True)
                return None
            part.replace(target)
            self._prune()
        return target, sha

    def _prune(self) -> None:
        """Drop cached files that belong to none of the newest `keep` known steps."""
        newest = sorted(self.known, reverse=True)[: self.keep]
        wanted = {f"{self.known[step][1]}.safetensors" for step in newest}
        for cached in self.cache_dir.glob("*.safetensors"):
            if cached.name not in wanted:
                cached.unlink(missing_ok=True)
