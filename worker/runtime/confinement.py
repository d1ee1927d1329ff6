"""The worker's side of confining process-runtime tasks (`confine.py` is the task's side).

A task must never see a key: not in its environment (the runtime gives it a clean one), not in
another process's `/proc/<pid>/environ` or `cmdline`, not in a file. Docker gives that by
construction; for the process runtime a root worker wraps the task's command in `confine.py`
(own PID and mount namespaces, a root holding only what the task needs, the `nobody` user). This
module decides whether that is possible here (`available()`: root, namespaces allowed, checked once
by running `true` confined), says what the task's root holds (`Jail`), and hands the task its
writable folders (`hand_over`).

`task_isolation` (worker setting `INTELLECT_WORKER_TASK_ISOLATION`): `auto` confines when
possible and otherwise runs tasks as the worker's user with a warning in the task's log; `require`
fails a task that cannot be confined, naming why; `off` never confines (a worker that trusts every
task it runs).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

CONFINE = Path(__file__).with_name("confine.py")
PROJECT_ROOT = Path(__file__).resolve().parents[2]
SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys")
TMP_BYTES = 1 << 30


class ConfinementUnavailable(RuntimeError):
    """Tasks cannot be confined on this host; the message says why and what to change."""


@functools.cache
def unavailable_reason() -> str | None:
    """None when tasks can be confined here, else why not (checked once per worker process)."""
    if os.geteuid() != 0:
        return "the worker does not run as root (confinement needs namespaces and a uid switch)"
    with tempfile.TemporaryDirectory(prefix="intellect-confine-probe-") as tmp:
        jail = Jail(uid=65534, gid=65534, root=Path(tmp), cwd="/", read_only=list(SYSTEM_FOLDERS))
        try:
            probe = subprocess.run(jail.command(["true"]), capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"the confinement probe did not run: {exc}"
    if probe.returncode != 0:
        return f"the confinement probe failed: {probe.stderr.strip() or f'exit code {probe.returncode}'}"
    return None


def _python_folders() -> list[str]:
    """The interpreter, its installation and the project's source folders, without hidden entries
    (a checkout's .devnet, .env and .git stay outside the task's root)."""
    folders = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
               os.path.dirname(os.path.realpath(sys.executable))}
    sources = {str(PROJECT_ROOT)} | {p for p in sys.path if p and os.path.isdir(p)}
    covered = tuple(f.rstrip("/") + "/" for f in folders | set(SYSTEM_FOLDERS))
    for source in sorted(sources):
        if (source.rstrip("/") + "/").startswith(covered):
            continue
        folders.update(str(child) for child in Path(source).iterdir() if not child.name.startswith("."))
    return sorted(folders)


@dataclass
class Jail:
    """What one confined task's root holds and whom it runs as."""

    uid: int
    gid: int
    root: Path  # an empty host folder: the mount point of the task's root
    cwd: str
    read_only: list[str] = field(default_factory=list)
    writable: list[str] = field(default_factory=list)
    shm_bytes: int = 1 << 30

    @classmethod
    def for_task(cls, uid: int, gid: int, run_dir: Path, cwd: Path, writable: list[Path],
                 extra_read_only: list[Path], shm_bytes: int) -> Jail:
        root = run_dir / "root"
        root.mkdir(parents=True, exist_ok=True)
        return cls(uid=uid, gid=gid, root=root, cwd=str(cwd), shm_bytes=shm_bytes,
                   read_only=[*SYSTEM_FOLDERS, *_python_folders(), *(str(p) for p in extra_read_only)],
                   writable=[str(p) for p in writable])

    def command(self, argv: list[str]) -> list[str]:
        spec = {"uid": self.uid, "gid": self.gid, "root": str(self.root), "cwd": self.cwd,
                "read_only": self.read_only, "writable": self.writable,
                "tmp_bytes": TMP_BYTES, "shm_bytes": self.shm_bytes}
        return [sys.executable, "-I", "-S", str(CONFINE), json.dumps(spec), "--", *argv]


def hand_over(folders: list[Path], uid: int, gid: int) -> None:
    """Make the task's writable folders (and what is in them) the task user's."""
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        for path in [folder, *folder.rglob("*")]:
            try:
                if path.lstat().st_uid != uid:
                    os.lchown(path, uid, gid)
            except FileNotFoundError:
                continue


def size_bytes(text: str) -> int:
    """'1g', '512m', '64k' or a byte count (Docker's shm_size notation) → bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)
