"""In-memory and local-file implementations of the pipeline's seams, for `intellect-validator check`
and tests: duplicates across the files of one run, checkpoints from paths given on the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads.model.loading import base_checkpoint_sha256, resolve
from workloads.rollouts import sha256_file as sha256_of


class MemorySeenStore:
    def __init__(self) -> None:
        self.files: dict[int | None, set[str]] = {}
        self.rows: dict[int | None, set[str]] = {}

    def file_seen(self, pool_id: int | None, sha256: str) -> bool:
        return sha256 in self.files.get(pool_id, set())

    def rows_seen(self, pool_id: int | None, row_hashes: list[str]) -> set[str]:
        return set(row_hashes) & self.rows.get(pool_id, set())

    def remember(self, pool_id: int | None, sha256: str, row_hashes: list[str]) -> None:
        self.files.setdefault(pool_id, set()).add(sha256)
        self.rows.setdefault(pool_id, set()).update(row_hashes)


class MemoryNodeWindows:
    """Each node's recent per-file statistics, for one run of `check` (or a test)."""

    def __init__(self) -> None:
        self.windows: dict[tuple[int | None, str], list[dict[str, Any]]] = {}

    def push(self, pool_id: int | None, node: str, entry: dict[str, Any], keep: int) -> list[dict[str, Any]]:
        window = self.windows.setdefault((pool_id, node.lower()), [])
        window.append(entry)
        del window[:-keep]
        return list(window)


class LocalCheckpoints:
    """Step 0 is the task's base model; other steps are safetensors files given explicitly."""

    def __init__(self, model: str = "tiny", steps: dict[int, Path] | None = None) -> None:
        self.model = model
        self.steps = {k: Path(v) for k, v in (steps or {}).items()}
        self._sha: dict[int, str] = {}

    def checkpoint_for(self, step: int) -> tuple[Path, str] | None:
        if step in self.steps:
            if step not in self._sha:
                self._sha[step] = sha256_of(self.steps[step])
            return self.steps[step], self._sha[step]
        if step == 0:
            sha = base_checkpoint_sha256(self.model)
            return (Path(resolve(self.model)) / "model.safetensors", sha) if sha else None
        return None
