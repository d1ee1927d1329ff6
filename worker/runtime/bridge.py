"""The task bridge: a unix socket through which a running task talks to its worker.

One socket per worker (file mode 0600 in a 0700 directory that holds nothing else; that directory
is mounted into containers at /run/intellect). A root worker that confines process tasks as another
user opens both to that user's group alone (0660 in 0710). Newline-delimited JSON, validated with
`intellect.wire.bridge`; every line gets one `BridgeReply` line back:
- `metrics`: latest value per label per task, read by the worker for its next heartbeat;
- `sign_link`: a group member's commitment to what crossed one of its links in a batch, signed with
  the node key (the task never holds it) over the fixed text `SignLinkMessage.claim_text`; refused
  without a signer (a worker started without its key) or for a task this worker does not run;
- `file_ready`: a finished file in the task's data dir, checked (inside the dir, exists, sha256
  matches) and written to the worker's file record (`worker.files`, `<state_dir>/files.sqlite`)
  before the answer, so a worker restart never loses an announced file; the uploader takes it from
  there (`bridge.files`).
A malformed or refused message gets `{"ok": false, "error": ...}` and a log line; it never
stops the server. The server runs an asyncio loop in a background thread (`start()` / `stop()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import os
import stat
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import structlog
from pydantic import ValidationError

from intellect.digests import sha256_file
from intellect.wire.bridge import (
    BridgeReply,
    FileReadyMessage,
    MetricsMessage,
    SignLinkMessage,
    bridge_message,
)
from worker.files import FILES_DB, WorkerFiles

log = structlog.get_logger(__name__)

MAX_LINE = 64 * 1024
MAX_LABELS_PER_TASK = 256
MAX_LABEL_LENGTH = 128
# AF_UNIX paths are limited to 108 bytes (including the terminating NUL) on Linux.
MAX_SOCKET_PATH = 107


def socket_path_for(state_dir: Path) -> Path:
    """`<state_dir>/sock/bridge.sock`, or, when that is too long for AF_UNIX, a private directory in
    the temp dir named after the state dir (ownership and mode are checked when the bridge starts)."""
    preferred = state_dir / "sock" / "bridge.sock"
    if len(os.fsencode(preferred.absolute())) <= MAX_SOCKET_PATH:
        return preferred.absolute()
    tag = hashlib.sha256(os.fsencode(state_dir.absolute())).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"intellect-{os.getuid()}-{tag}" / "bridge.sock"


class BridgeRejected(ValueError):
    """A message the worker refuses; the text goes back to the task."""


@dataclass
class TaskEntry:
    data_dir: Path
    container_data_dir: str | None


def describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        where = ".".join(str(p) for p in item["loc"]) or "message"
        parts.append(f"{where}: {item['msg']}")
    return "invalid message: " + "; ".join(parts)


def _reply_line(reply: BridgeReply) -> bytes:
    """One reply line; `signature` only on a `sign_link` answer (the other replies keep their shape)."""
    return reply.model_dump_json(exclude={"signature"} if reply.signature is None else None).encode() + b"\n"


class TaskBridge:
    def __init__(self, socket_path: Path, state_dir: Path, task_gid: int | None = None,
                 signer: Callable[[str], str] | None = None) -> None:  # fmt: skip
        """`task_gid`: the group confined tasks run as; it alone (with this user) may reach the socket
        (folder 0710, socket 0660). None keeps both private to this user (0700, 0600). `signer`: the
        node key's EIP-191 signature of a text (`Wallet.sign_message`), for `sign_link`."""
        self.signer = signer
        if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"bridge socket path {socket_path} is longer than {MAX_SOCKET_PATH} bytes "
                "(a unix socket limit): choose a shorter worker state directory"
            )
        self.socket_path = socket_path
        self.task_gid = task_gid
        self.files = WorkerFiles(state_dir / FILES_DB)
        self._tasks: dict[str, TaskEntry] = {}
        self._metrics: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None

    # ---- what the worker uses --------------------------------------------------------------
    def allow_task(self, task_id: str, data_dir: Path, container_data_dir: str | None = None) -> None:
        """Accept messages for `task_id`; its files must live in `data_dir` (seen by the task as
        `container_data_dir` when it runs in a container)."""
        with self._lock:
            self._tasks[task_id] = TaskEntry(data_dir, container_data_dir)

    def forget_task(self, task_id: str) -> None:
        with self._lock:
            self._tasks.pop(task_id, None)
            self._metrics.pop(task_id, None)

    def metrics(self, task_id: str) -> dict[str, float]:
        """Latest value per label (gauges: a lost heartbeat loses nothing, the next one has them)."""
        with self._lock:
            return dict(self._metrics.get(task_id, {}))

    # ---- message handling ------------------------------------------------------------------
    async def handle_line(self, line: bytes) -> BridgeReply:
        try:
            message = bridge_message.validate_json(line)
        except ValidationError as exc:
            return self._refuse(describe(exc), line)
        try:
            if isinstance(message, MetricsMessage):
                self._record_metrics(message)
            elif isinstance(message, SignLinkMessage):
                return BridgeReply(ok=True, signature=self._sign_link(message))
            else:
                await self._file_ready(message)
        except BridgeRejected as exc:
            return self._refuse(str(exc), line)
        return BridgeReply(ok=True)

    def _sign_link(self, message: SignLinkMessage) -> str:
        self._entry(message.task_id)
        if self.signer is None:
            raise BridgeRejected("this worker signs no link commitments (started without its node key)")
        return self.signer(message.claim_text())

    def _refuse(self, reason: str, line: bytes) -> BridgeReply:
        log.warning("bridge refused a message", line=repr(line[:200]), reason=reason)
        return BridgeReply(ok=False, error=reason)

    def _entry(self, task_id: str) -> TaskEntry:
        with self._lock:
            entry = self._tasks.get(task_id)
        if entry is None:
            raise BridgeRejected(f"unknown task {task_id!r}: this worker is not running it")
        return entry

    def _record_metrics(self, message: MetricsMessage) -> None:
        self._entry(message.task_id)
        for label, value in message.metrics.items():
            if not label or len(label) > MAX_LABEL_LENGTH:
                raise BridgeRejected(f"metric label must be 1..{MAX_LABEL_LENGTH} characters")
            if not math.isfinite(value):
                raise BridgeRejected(f"metric {label!r} is not a finite number")
        with self._lock:
            current = self._metrics.setdefault(message.task_id, {})
            if len(set(current) | set(message.metrics)) > MAX_LABELS_PER_TASK:
                raise BridgeRejected(f"more than {MAX_LABELS_PER_TASK} metric labels for one task")
            current.update(message.metrics)

    def resolve(self, entry: TaskEntry, announced: str) -> tuple[Path, str]:
        """The host path of an announced file, which must be a regular file inside the data dir."""
        path = PurePosixPath(announced)
        root = entry.data_dir.resolve()
        outside = BridgeRejected(
            f"path {announced!r} is outside the task's data directory "
            f"({entry.container_data_dir or entry.data_dir})"
        )
        if path.is_absolute():
            container = PurePosixPath(entry.container_data_dir) if entry.container_data_dir else None
            if container is not None and (path == container or container in path.parents):
                path = path.relative_to(container)
            else:
                try:
                    path = PurePosixPath(Path(path).resolve().relative_to(root))
                except ValueError:
                    raise outside from None
        host = (root / path).resolve()
        if root not in host.parents:
            raise outside
        try:
            mode = host.stat().st_mode
        except OSError:
            raise BridgeRejected(f"no such file: {announced!r}") from None
        if not stat.S_ISREG(mode):
            raise BridgeRejected(f"not a regular file: {announced!r}")
        return host, str(host.relative_to(root))

    async def _file_ready(self, message: FileReadyMessage) -> None:
        entry = self._entry(message.task_id)
        host, relative = self.resolve(entry, message.path)
        # Hash off the event loop: files can be large and other tasks' messages must not wait.
        actual = await asyncio.to_thread(sha256_file, host)
        if actual != message.sha256:
            raise BridgeRejected(
                f"sha256 mismatch for {relative}: announced {message.sha256}, file has {actual}"
            )
        queued, created = self.files.add(
            message.task_id, host, relative, actual, message.work_units, host.stat().st_size
        )
        log.info(
            "bridge queued a file" if created else "bridge already had the file queued",
            file=relative, sha256=actual[:12], work_units=queued.work_units, task_id=message.task_id,
        )

    async def _serve_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    line = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError as exc:
                    line = exc.partial  # a last message without a newline still counts
                    if not line.strip():
                        return
                except asyncio.LimitOverrunError:
                    reply = self._refuse(f"message longer than {MAX_LINE} bytes", b"")
                    writer.write(_reply_line(reply))
                    await writer.drain()
                    return
                if line.strip():
                    try:
                        reply = await self.handle_line(line)
                    except Exception as exc:  # never let one message take the server down
                        log.exception("bridge failed to handle a message")
                        reply = BridgeReply(ok=False, error=f"internal error: {type(exc).__name__}")
                    writer.write(_reply_line(reply))
                    await writer.drain()
                if reader.at_eof():
                    return
        except (ConnectionError, OSError):
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    # ---- lifecycle -------------------------------------------------------------------------
    def _prepare_socket_dir(self) -> None:
        directory = self.socket_path.parent
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = directory.lstat()
        # The directory may sit in a shared temp dir: never use one someone else made (or a symlink).
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            raise PermissionError(
                f"{directory} is not a directory owned by this user; remove it or choose "
                "another state directory"
            )
        if self.task_gid is None:
            os.chmod(directory, 0o700)
        else:
            os.chown(directory, -1, self.task_gid)
            os.chmod(directory, 0o710)
        if self.socket_path.exists() or self.socket_path.is_symlink():
            if not stat.S_ISSOCK(self.socket_path.lstat().st_mode):
                raise FileExistsError(
                    f"{self.socket_path} exists and is not a socket; refusing to replace it"
                )
            self.socket_path.unlink()  # left by a worker that did not shut down cleanly

    async def _start_server(self) -> None:
        self._server = await asyncio.start_unix_server(
            self._serve_client, path=str(self.socket_path), limit=MAX_LINE
        )
        if self.task_gid is None:
            os.chmod(self.socket_path, 0o600)
        else:
            os.chown(self.socket_path, -1, self.task_gid)
            os.chmod(self.socket_path, 0o660)

    def start(self) -> TaskBridge:
        self._prepare_socket_dir()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="task-bridge", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start_server(), self._loop).result(timeout=10)
        log.info("bridge listening", socket=str(self.socket_path))
        return self

    def stop(self) -> None:
        if self._loop is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()
            # Open client connections too, so no transport outlives the loop.
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._loop.close()
        self._loop = self._thread = self._server = None
        self.socket_path.unlink(missing_ok=True)

    def __enter__(self) -> TaskBridge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
