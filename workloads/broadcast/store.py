"""Versions on disk: `<root>/v<N>/manifest.json` + `shard_{i:05d}.bin`, the newest `keep` of them.

Every file appears under its final name only once complete (temp name, then rename), so a crash
never leaves a torn shard or manifest behind. On start the directory is re-read: an origin's
half-published version lives in a hidden temp directory and is discarded; a relay's version with a
manifest but missing shards is kept and resumed (its relay fetches what is missing). A shard file is
renamed into place only after its sha256 matched, so a present shard is a verified shard.

Thread-safe: the relay's fetch threads add shards while the server threads read.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import uuid
from pathlib import Path

import structlog

from workloads.broadcast.errors import PublishError
from workloads.broadcast.manifest import (
    DEFAULT_SHARD_SIZE,
    VersionManifest,
    parse_shard_name,
    scan_file,
    shard_name,
)

log = structlog.get_logger(__name__)

VERSION_DIR = re.compile(r"^v(\d+)$")
MANIFEST = "manifest.json"
TEMP_PREFIX = ".tmp-"


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{TEMP_PREFIX}{uuid.uuid4().hex}-{path.name}")
    tmp.write_bytes(data)
    tmp.replace(path)


class VersionStore:
    """The directory of versions an origin or relay serves."""

    def __init__(self, root: Path, keep: int = 5) -> None:
        self.root = Path(root)
        self.keep = max(1, keep)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._manifests: dict[int, VersionManifest] = {}
        self._present: dict[int, set[int]] = {}
        self.refresh(clean=True)

    # ---- reading -------------------------------------------------------------------------------

    def version_dir(self, version: int) -> Path:
        return self.root / f"v{version}"

    def shard_path(self, version: int, index: int) -> Path:
        return self.version_dir(version) / shard_name(index)

    def manifest(self, version: int) -> VersionManifest | None:
        with self._lock:
            return self._manifests.get(version)

    def manifests(self) -> list[VersionManifest]:
        """Every version whose manifest is known (complete or still arriving), oldest first."""
        with self._lock:
            return [self._manifests[v] for v in sorted(self._manifests)]

    def versions(self) -> list[int]:
        with self._lock:
            return sorted(self._manifests)

    def newest(self) -> int:
        """The newest version held (0: none): what a long-poll of `GET /versions?after=N` compares."""
        with self._lock:
            return max(self._manifests, default=0)

    def has_shard(self, version: int, index: int) -> bool:
        with self._lock:
            return index in self._present.get(version, ())

    def missing_shards(self, version: int) -> list[int]:
        with self._lock:
            manifest = self._manifests.get(version)
            if manifest is None:
                return []
            present = self._present.get(version, set())
            return [s.index for s in manifest.shards if s.index not in present]

    def is_complete(self, version: int) -> bool:
        with self._lock:
            manifest = self._manifests.get(version)
            return manifest is not None and len(self._present.get(version, ())) == len(manifest.shards)

    # ---- loading -------------------------------------------------------------------------------

    def refresh(self, clean: bool = False) -> None:
        """Re-read the directory: picks up versions another process published into it (the CLI's
        `publish` next to a running origin) and forgets deleted ones. With `clean` (start-up), remove
        leftovers of a crash: temp files and version directories without a manifest."""
        found: dict[int, VersionManifest] = {}
        present: dict[int, set[int]] = {}
        for entry in sorted(self.root.iterdir()):
            match = VERSION_DIR.match(entry.name)
            if not match or not entry.is_dir():
                if clean and entry.name.startswith(TEMP_PREFIX):
                    if entry.is_dir():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)
                    log.info("discarded half-written entry", path=str(entry))
                continue
            version = int(match.group(1))
            manifest_path = entry / MANIFEST
            if not manifest_path.exists():
                if clean:
                    shutil.rmtree(entry, ignore_errors=True)
                    log.info("discarded version without manifest", version=version)
                continue
            with self._lock:
                known = self._manifests.get(version)
            try:
                manifest = known or VersionManifest.parse(manifest_path.read_bytes(), str(manifest_path))
            except Exception as exc:  # unreadable manifest: the version is unusable, say so and move on
                log.warning("ignoring version with a bad manifest", version=version, error=str(exc))
                continue
            found[version] = manifest
            present[version] = self._scan_shards(entry, manifest, clean)
        with self._lock:
            # Entries added by this process while we scanned stay (their directory still exists).
            for version, manifest in self._manifests.items():
                if version not in found and (self.version_dir(version) / MANIFEST).exists():
                    found[version] = manifest
                present.setdefault(version, set()).update(self._present.get(version, ()))
            self._manifests = found
            self._present = {v: present.get(v, set()) for v in found}

    def _scan_shards(self, folder: Path, manifest: VersionManifest, clean: bool) -> set[int]:
        have: set[int] = set()
        for path in folder.iterdir():
            if path.name.startswith(TEMP_PREFIX):
                if clean:
                    path.unlink(missing_ok=True)
                continue
            index = parse_shard_name(path.name)
            if index is not None and 1 <= index <= len(manifest.shards):
                if path.stat().st_size == manifest.shard(index).size:
                    have.add(index)
                elif clean:
                    path.unlink(missing_ok=True)
        return have

    # ---- writing: origin -----------------------------------------------------------------------

    def publish(
        self,
        path: Path,
        version: int,
        shard_size: int = DEFAULT_SHARD_SIZE,
        expected_sha256: str | None = None,
    ) -> VersionManifest:
        """Split `path` into a new version: shards and manifest go to a hidden temp directory that is
        renamed to `v<N>` at the end, so readers see all of it or nothing. Publishing the same bytes
        again is a no-op; other bytes under an existing version number are refused."""
        path = Path(path)
        if not path.is_file():
            raise PublishError(f"cannot publish {path}: no such file")
        existing = self.manifest(version)
        tmp = self.root / f"{TEMP_PREFIX}v{version}-{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            manifest = scan_file(path, version, shard_size, lambda i: open(tmp / shard_name(i), "wb"))  # noqa: SIM115 (scan_file closes it)
            if expected_sha256 and manifest.sha256 != expected_sha256.lower():
                raise PublishError(
                    f"{path} has sha256 {manifest.sha256} but its checkpoint manifest says {expected_sha256}"
                )
            if existing is not None:
                if existing.sha256 == manifest.sha256:
                    return existing
                raise PublishError(
                    f"version {version} already holds other bytes (sha256 {existing.sha256}); "
                    "versions are immutable, publish under a new number"
                )
            (tmp / MANIFEST).write_bytes(manifest.model_dump_json(indent=1).encode())
            os.replace(tmp, self.version_dir(version))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        with self._lock:
            self._manifests[version] = manifest
            self._present[version] = {s.index for s in manifest.shards}
        log.info("published", version=version, size=manifest.size, shards=len(manifest.shards))
        self.prune()
        return manifest

    # ---- writing: relay ------------------------------------------------------------------------

    def add_manifest(self, manifest: VersionManifest) -> bool:
        """Start mirroring a version: its manifest is stored first (so it can be listed and resumed
        after a restart), shards follow. False when it is already known."""
        with self._lock:
            if manifest.version in self._manifests:
                return False
        folder = self.version_dir(manifest.version)
        folder.mkdir(parents=True, exist_ok=True)
        _write_atomic(folder / MANIFEST, manifest.model_dump_json(indent=1).encode())
        with self._lock:
            self._manifests[manifest.version] = manifest
            self._present.setdefault(manifest.version, set())
        self.prune()
        return True

    def temp_shard(self, version: int, index: int) -> Path:
        """A unique temp path next to the shard's final place (same filesystem: rename is atomic)."""
        return self.version_dir(version) / f"{TEMP_PREFIX}{uuid.uuid4().hex}-{shard_name(index)}"

    def commit_shard(self, version: int, index: int, tmp: Path) -> bool:
        """Move a verified temp shard into place. False (temp removed) if the version was pruned."""
        with self._lock:
            if version not in self._manifests:
                tmp.unlink(missing_ok=True)
                return False
        try:
            tmp.replace(self.shard_path(version, index))
        except FileNotFoundError:  # pruned between the check and the rename
            return False
        with self._lock:
            if version in self._present:
                self._present[version].add(index)
        return True

    def forget_shard(self, version: int, index: int) -> None:
        """Drop a shard found bad on disk, so it is fetched again and never served meanwhile."""
        with self._lock:
            self._present.get(version, set()).discard(index)
        self.shard_path(version, index).unlink(missing_ok=True)

    # ---- pruning -------------------------------------------------------------------------------

    def prune(self) -> list[int]:
        """Delete all but the newest `keep` versions (by number); returns the deleted ones."""
        with self._lock:
            old = sorted(self._manifests)[: -self.keep]
            for version in old:
                self._manifests.pop(version, None)
                self._present.pop(version, None)
        for version in old:
            shutil.rmtree(self.version_dir(version), ignore_errors=True)
            log.info("pruned", version=version, keep=self.keep)
        return old
