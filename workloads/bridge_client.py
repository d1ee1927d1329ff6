"""Workload side of the task bridge: tell the worker about metrics and finished files.

Standard library only, so it runs in the smallest task image (python3 and nothing else). The worker
passes everything through the environment:
  INTELLECT_SOCKET_PATH  the worker's unix socket (also `${SOCKET_PATH}` in task specs)
  INTELLECT_TASK_ID      the task this process belongs to
  INTELLECT_DATA_DIR     the task's data directory (`/data` in a container)
One JSON object per line; the worker answers each with `{"ok": bool, "error": str|null}`.
Also a CLI for shell workloads:
  python3 -m workloads.bridge_client metrics loss=0.5 tokens=1200
  python3 -m workloads.bridge_client file /data/rollouts.parquet --work-units 16
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

MAX_LINE = 64 * 1024


class BridgeError(RuntimeError):
    """The worker refused a message (the reason is the worker's) or could not be reached."""


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise BridgeError(f"{name} is not set: is this process running as an Intellect task?")
    return value


def send(message: dict[str, Any], socket_path: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
    """Send one message, return the worker's reply; raise BridgeError when it is not ok."""
    path = socket_path or _env("INTELLECT_SOCKET_PATH")
    payload = (json.dumps(message, separators=(",", ":")) + "\n").encode()
    if len(payload) > MAX_LINE:
        raise BridgeError(f"message of {len(payload)} bytes exceeds the bridge limit of {MAX_LINE}")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(payload)
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                reply += chunk
    except OSError as exc:
        raise BridgeError(f"cannot reach the worker's bridge at {path}: {exc}") from exc
    try:
        answer = json.loads(reply)
    except ValueError as exc:
        raise BridgeError(f"unreadable reply from the worker: {reply[:200]!r}") from exc
    if not answer.get("ok"):
        raise BridgeError(answer.get("error") or "rejected without a reason")
    return answer


def report_metrics(metrics: dict[str, float]) -> None:
    """Latest value per label; the worker includes them in its next heartbeat."""
    values = {str(k): float(v) for k, v in metrics.items()}
    send({"type": "metrics", "task_id": _env("INTELLECT_TASK_ID"), "metrics": values})


def sign_link(*, group_id: str, batch: int, sender: int, receiver: int, role: str, sha256: str,
              task_id: str | None = None) -> str:
    """The node key's signature (by the worker: the task holds no key) of what crossed one of this group
    member's links in one batch (`intellect.wire.bridge.SignLinkMessage`)."""
    answer = send({"type": "sign_link", "task_id": task_id or _env("INTELLECT_TASK_ID"), "group_id": group_id,
                   "batch": batch, "sender": sender, "receiver": receiver, "role": role, "sha256": sha256})
    signature = answer.get("signature")
    if not isinstance(signature, str):
        raise BridgeError("the worker answered a sign_link without a signature")
    return signature


def sha256_file(path: str | os.PathLike[str]) -> str:
    """`intellect.digests.sha256_file` again, on purpose: this module ships alone into task images
    (standard library only, images/build.sh copies just this file), where `intellect` is not installed."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _relative_to_data_dir(path: str) -> str:
    """Send paths relative to the data dir: unambiguous whether the worker sees /data or a host dir."""
    data_dir = os.environ.get("INTELLECT_DATA_DIR")
    candidate = Path(path)
    if data_dir and candidate.is_absolute():
        try:
            return str(candidate.relative_to(data_dir))
        except ValueError:
            return path  # the worker rejects it with a reason naming the data dir
    return path


def announce_file(path: str | os.PathLike[str], sha256: str | None = None, work_units: int = 0) -> None:
    """Queue a finished file in the task's data dir for upload and on-chain submission.

    A relative `path` is relative to the data dir (as the worker reads it), not to the working
    directory. `sha256` is computed when omitted; the worker checks it against the file either way.
    """
    local = Path(path)
    if not local.is_absolute() and os.environ.get("INTELLECT_DATA_DIR"):
        local = Path(os.environ["INTELLECT_DATA_DIR"]) / local
    digest = sha256 or sha256_file(local)
    send(
        {
            "type": "file_ready",
            "task_id": _env("INTELLECT_TASK_ID"),
            "path": _relative_to_data_dir(os.fspath(path)),
            "sha256": digest,
            "work_units": int(work_units),
        }
    )


def main(argv: list[str]) -> int:
    usage = "usage: bridge_client metrics LABEL=VALUE... | file PATH [--work-units N] [--sha256 HEX]"
    try:
        if len(argv) >= 2 and argv[0] == "metrics":
            report_metrics({k: float(v) for k, v in (item.split("=", 1) for item in argv[1:])})
        elif len(argv) >= 2 and argv[0] == "file":
            options = dict(zip(argv[2::2], argv[3::2], strict=False))
            announce_file(argv[1], options.get("--sha256"), int(options.get("--work-units", "0")))
        else:
            print(usage, file=sys.stderr)
            return 2
    except (BridgeError, ValueError, OSError) as exc:
        print(f"bridge: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
