"""Checkpoints per trainer step: fetched from a local path or an HTTP(S) URL, sha256-verified
against a `<file>.sha256` sidecar, cached under `cache_dir/step_<N>.safetensors`, at most `keep`
versions on disk (async level + 1: older ones can never be used again)."""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path

import httpx

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    pass


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class CheckpointStore:
    def __init__(self, source_template: str, cache_dir: Path, keep: int, timeout: float = 60.0):
        if "{step}" not in source_template:
            raise ValueError(f"checkpoint source {source_template!r} needs a '{{step}}' placeholder")
        self.template = source_template
        self.cache_dir = Path(cache_dir)
        self.keep = max(1, keep)
        self.timeout = timeout
        self.cache_dir.mkdir(parents=True, exist_ok=True)

    def cached(self, step: int) -> Path:
        return self.cache_dir / f"step_{step}.safetensors"

    def fetch(self, step: int) -> Path | None:
        """The verified local file for `step`, or None when the source does not have it (yet)."""
        target = self.cached(step)
        if target.exists():
            return target
        source = self.template.format(step=step)
        tmp = target.with_suffix(".part")
        if source.startswith(("http://", "https://")):
            expected = self._get_text(source + ".sha256")
            if expected is None:
                return None
            with httpx.stream("GET", source, timeout=self.timeout, follow_redirects=True) as resp:
                if resp.status_code == 404:
                    return None
                resp.raise_for_status()
                with open(tmp, "wb") as f:
                    for block in resp.iter_bytes(1 << 20):
                        f.write(block)
        else:
            path = Path(source)
            sidecar = Path(source + ".sha256")
            if not path.exists():
                return None
            if not sidecar.exists():
                raise CheckpointError(
                    f"checkpoint {path} has no {sidecar.name} next to it; refusing unverified weights"
                )
            expected = sidecar.read_text()
            shutil.copyfile(path, tmp)
        want = expected.split()[0].strip().lower() if expected.strip() else ""
        got = _sha256(tmp)
        if got != want:
            tmp.unlink(missing_ok=True)
            raise CheckpointError(
                f"checkpoint for step {step} from {source}: sha256 {got} != expected {want}"
            )
        tmp.replace(target)
        self._prune(step)
        log.info("checkpoint step %d fetched from %s", step, source)
        return target

    def _get_text(self, url: str) -> str | None:
        resp = httpx.get(url, timeout=self.timeout, follow_redirects=True)
        if resp.status_code == 404:
            return None
        resp.raise_for_status()
        return resp.text

    def _prune(self, newest: int) -> None:
        files = sorted(self.cache_dir.glob("step_*.safetensors"), key=lambda p: int(p.stem.split("_")[1]))
        for old in files[: -self.keep]:
            old.unlink(missing_ok=True)

    def versions(self) -> list[int]:
        return sorted(int(p.stem.split("_")[1]) for p in self.cache_dir.glob("step_*.safetensors"))
