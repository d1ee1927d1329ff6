"""Checkpoints per trainer step: fetched from a local path or an HTTP(S) URL, sha256-verified
against a `<file>.sha256` sidecar, cached under `cache_dir/step_<N>.safetensors`, at most `keep`
versions on disk (async level + 1: older ones can never be used again).

A source `broadcast:http://relay1:port,http://relay2:port` (no `{step}` needed) downloads version
`step` from those broadcast relays instead (workloads/broadcast): sharded, concurrent, each shard and
the whole file checked against the version's manifest, whose sha256 is then checked here again."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import structlog

from intellect.digests import sha256_file
from intellect.http_client import shared as http_client

log = structlog.get_logger(__name__)


BROADCAST_PREFIX = "broadcast:"


class CheckpointError(RuntimeError):
    pass


class CheckpointStore:
    def __init__(self, source_template: str, cache_dir: Path, keep: int, timeout: float = 60.0):
        self.relays: list[str] = []
        if source_template.startswith(BROADCAST_PREFIX):
            urls = source_template[len(BROADCAST_PREFIX) :].split(",")
            self.relays = [u.strip() for u in urls if u.strip()]
            if not self.relays:
                raise ValueError(f"checkpoint source {source_template!r}: no relay URL after 'broadcast:'")
        elif "{step}" not in source_template:
            raise ValueError(f"checkpoint source {source_template!r} needs a '{{step}}' placeholder")
        self.template = source_template
        self.cache_dir = Path(cache_dir)
        self.keep = max(1, keep)
        self.timeout = timeout
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.misses: dict[int, str] = {}  # step -> what the source answered when it did not have it

    def cached(self, step: int) -> Path:
        return self.cache_dir / f"step_{step}.safetensors"

    def fetch(self, step: int) -> Path | None:
        """The verified local file for `step`, or None when the source does not have it (yet); then
        `misses[step]` says what was asked and what came back (URL and HTTP status, or the relays'
        answers), so a wrong source is told apart from a step not published yet."""
        target = self.cached(step)
        if target.exists():
            return target
        self.misses.pop(step, None)
        tmp = target.with_suffix(".part")
        if self.relays:
            expected = self._fetch_broadcast(step, tmp)
            if expected is None:
                return None
            source = f"broadcast relays {', '.join(self.relays)}"
        elif (source := self.template.format(step=step)).startswith(("http://", "https://")):
            expected = self._get_text(source + ".sha256", step)
            if expected is None:
                return None
            try:
                with http_client().stream("GET", source, timeout=self.timeout, follow_redirects=True) as resp:
                    if resp.status_code == 404:
                        self.misses[step] = f"GET {source}: HTTP 404"
                        return None
                    self._refuse_status(source, resp)
                    with open(tmp, "wb") as f:
                        for block in resp.iter_bytes(1 << 20):
                            f.write(block)
            except httpx.TransportError as exc:
                raise CheckpointError(f"checkpoint source {source} unreachable: {exc!r}") from None
        else:
            path = Path(source)
            sidecar = Path(source + ".sha256")
            if not path.exists():
                self.misses[step] = f"{path}: no such file"
                return None
            if not sidecar.exists():
                raise CheckpointError(
                    f"checkpoint {path} has no {sidecar.name} next to it; refusing unverified weights"
                )
            expected = sidecar.read_text()
            shutil.copyfile(path, tmp)
        want = expected.split()[0].strip().lower() if expected.strip() else ""
        got = sha256_file(tmp)
        if got != want:
            tmp.unlink(missing_ok=True)
            raise CheckpointError(
                f"checkpoint for step {step} from {source}: sha256 {got} != expected {want}"
            )
        tmp.replace(target)
        self._prune(step)
        log.info("checkpoint fetched", step=step, source=source)
        return target

    def _fetch_broadcast(self, step: int, tmp: Path) -> str | None:
        """Download version `step` from the relays into `tmp`; its manifest's sha256, or None when no
        relay holds the step (not published yet)."""
        from workloads.broadcast.client import download
        from workloads.broadcast.errors import BroadcastError, VersionNotFound

        try:
            result = download(step, tmp, self.relays, timeout=self.timeout)
        except VersionNotFound as exc:
            self.misses[step] = str(exc)  # each relay's answer: HTTP 404, or why it could not be asked
            return None
        except BroadcastError as exc:
            raise CheckpointError(f"checkpoint for step {step} from broadcast relays: {exc}") from exc
        return result.digest

    def _get_text(self, url: str, step: int) -> str | None:
        try:
            resp = http_client().get(url, timeout=self.timeout, follow_redirects=True)
        except httpx.TransportError as exc:
            raise CheckpointError(f"checkpoint source {url} unreachable: {exc!r}") from None
        if resp.status_code == 404:
            self.misses[step] = f"GET {url}: HTTP 404"
            return None
        self._refuse_status(url, resp)
        return resp.text

    @staticmethod
    def _refuse_status(url: str, resp: httpx.Response) -> None:
        if resp.status_code >= 400:
            raise CheckpointError(f"checkpoint source GET {url}: HTTP {resp.status_code}")

    def _prune(self, newest: int) -> None:
        files = sorted(self.cache_dir.glob("step_*.safetensors"), key=lambda p: int(p.stem.split("_")[1]))
        for old in files[: -self.keep]:
            old.unlink(missing_ok=True)

    def sha256(self, step: int) -> str | None:
        """sha256 of the cached (verified) checkpoint of `step`, or None when it is not cached."""
        path = self.cached(step)
        return sha256_file(path) if path.exists() else None

    def versions(self) -> list[int]:
        return sorted(int(p.stem.split("_")[1]) for p in self.cache_dir.glob("step_*.safetensors"))
