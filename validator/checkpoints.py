"""Checkpoints as the trainer publishes them: its step counter (`GET /step`) lists, for each step a
worker may still use, the checkpoint's URL and sha256; a step no longer listed (a validator that lags
more than the async level, or judges after the trainer's last step) is looked up by itself
(`GET /checkpoints/{step}` beside `/step`): the trainer keeps and serves every checkpoint that files
still waiting for judgement may name until their vote window has passed (docs/trainer.md,
"Checkpoints kept for the judges"). Step 0, the base model, is the judge's to resolve when the trainer
lists none (`workloads.model.loading.ModelCheckpoints`). Files are fetched once, verified, and cached
by sha256: the `keep` most recently used (default 16), so a long run does not fill the validator's
disk with every checkpoint it ever saw, and a lagging validator does not drop the old checkpoint it is
judging files against because the trainer has moved on (the rule was once "the newest 16 steps": a
step fetched behind them was deleted as soon as it was fetched)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
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
            self._remember(int(step), entry)

    def _remember(self, step: int, entry: object) -> None:
        if isinstance(entry, dict) and entry.get("url") and entry.get("sha256"):
            self.known[step] = (str(entry["url"]), str(entry["sha256"]).lower())

    def _look_up(self, step: int) -> None:
        """A step the listing no longer names: `/checkpoints/{step}` beside the step URL (404 once the
        trainer dropped it; a trainer older than that lookup answers 404 too)."""
        url = httpx.URL(self.step_url).join(f"checkpoints/{step}")
        try:
            response = http_client().get(url, timeout=self.timeout)
            if response.status_code != 200:
                return
            body = response.json()
        except (httpx.HTTPError, ValueError):
            return
        if isinstance(body, dict) and body.get("step") == step:
            self._remember(step, body)

    def checkpoint_for(self, step: int) -> tuple[Path, str] | None:
        with self._lock:
            return self._checkpoint_for(step)

    def _checkpoint_for(self, step: int) -> tuple[Path, str] | None:
        if step not in self.known:
            self._refresh()
        if step not in self.known:
            self._look_up(step)
        if step not in self.known:
            return None
        url, sha = self.known[step]
        target = self.cache_dir / f"{sha}.safetensors"
        if target.exists():
            _touch(target)  # used now: the cache drops the least recently used
        else:
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
            _touch(target)
            self._prune(target)
        return target, sha

    def _prune(self, fetched: Path) -> None:
        """Keep the `keep` most recently used cached files (by modification time: set when fetched,
        touched when used again, so also across a restart), never the one just fetched."""
        cached = sorted(self.cache_dir.glob("*.safetensors"), key=lambda p: p.stat().st_mtime_ns)
        for old in cached[: -self.keep]:
            if old != fetched:
                old.unlink(missing_ok=True)


def _touch(path: Path) -> None:
    """Modification time now, to the nanosecond (the file system's own clock may tick in milliseconds:
    files fetched in one tick would tie)."""
    now = time.time_ns()
    os.utime(path, ns=(now, now))
