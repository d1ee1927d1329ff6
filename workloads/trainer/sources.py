"""Where validated rollouts come from: the validator's accepted feed (`GET /accepted`, the only
input of a real run) or a local folder (standalone runs and tests), behind one Protocol.

Each file is identified by its sha256; the trainer remembers the ids it consumed (in its
checkpoint state), so no file is ever trained on twice, also across restarts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from intellect.digests import sha256_file
from intellect.http_client import shared as http_client


class RolloutFile(BaseModel):
    file_id: str  # sha256 of the bytes
    path: Path
    cursor: int = 0  # feed position (0 for a folder)


class RolloutSource(Protocol):
    def new_files(self, seen: set[str]) -> list[RolloutFile]: ...


class LocalDirSource:
    """Every `*.parquet` in a folder (written atomically by the inference workload), oldest first."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._ids: dict[Path, tuple[float, str]] = {}

    def new_files(self, seen: set[str]) -> list[RolloutFile]:
        out = []
        for path in sorted(self.folder.glob("*.parquet"), key=lambda p: (p.stat().st_mtime, p.name)):
            mtime = path.stat().st_mtime
            cached = self._ids.get(path)
            file_id = cached[1] if cached and cached[0] == mtime else sha256_file(path)
            self._ids[path] = (mtime, file_id)
            if file_id not in seen:
                out.append(RolloutFile(file_id=file_id, path=path))
        return out


class AcceptedFeedSource:
    """The validator's `/accepted` feed: files in acceptance order, downloaded and sha256-checked."""

    def __init__(
        self, validator_url: str, download_dir: Path, pool_id: int | None = None, timeout: float = 60.0
    ):
        self.url = validator_url.rstrip("/")
        self.pool_id = pool_id
        self.download_dir = download_dir
        self.timeout = timeout
        self.cursor = 0
        download_dir.mkdir(parents=True, exist_ok=True)

    def new_files(self, seen: set[str]) -> list[RolloutFile]:
        params: dict[str, int] = {"after": self.cursor, "limit": 500}
        if self.pool_id is not None:
            params["pool"] = self.pool_id
        page = http_client().get(f"{self.url}/accepted", params=params, timeout=self.timeout)
        page.raise_for_status()
        body = page.json()
        out = []
        for item in body["items"]:
            sha = item["sha256"]
            if sha in seen:
                self.cursor = item["cursor"]
                continue
            target = self.download_dir / f"{sha}.parquet"
            if not target.exists() or sha256_file(target) != sha:
                part = target.with_suffix(".part")
                with http_client().stream("GET", item["url"], timeout=self.timeout) as resp:
                    resp.raise_for_status()
                    with open(part, "wb") as f:
                        for block in resp.iter_bytes(1 << 20):
                            f.write(block)
                if sha256_file(part) != sha:
                    part.unlink(missing_ok=True)
                    raise ValueError(f"accepted file {sha} arrived with another sha256; will fetch again")
                part.replace(target)
            out.append(RolloutFile(file_id=sha, path=target, cursor=item["cursor"]))
            self.cursor = item["cursor"]
        return out


def source_for(spec: str, work_dir: Path, pool_id: int | None) -> RolloutSource:
    """The source `--rollouts` names; ValueError when it is neither a URL nor an existing folder (a
    typo would otherwise become a new, forever empty folder and a trainer waiting on it)."""
    if spec.startswith(("http://", "https://")):
        return AcceptedFeedSource(spec, work_dir / "accepted", pool_id)
    folder = Path(spec)
    if not folder.is_dir():
        raise ValueError(
            f"--rollouts {spec!r} is neither a validator URL (http://… or https://…) nor an existing "
            "folder of rollout files"
        )
    return LocalDirSource(folder)
