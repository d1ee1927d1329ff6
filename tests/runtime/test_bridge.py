"""The task bridge on its own: a real unix socket server, the workload client, the durable file record."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import stat
import tempfile
from pathlib import Path

import pytest

from worker.runtime.bridge import MAX_LINE, TaskBridge
from workloads import bridge_client


@pytest.fixture
def task(bridge: TaskBridge, short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A task the bridge accepts, with the client's environment set as a runtime would set it."""
    data = short_tmp / "data"
    data.mkdir()
    bridge.allow_task("task-1", data, "/data")
    monkeypatch.setenv("INTELLECT_SOCKET_PATH", str(bridge.socket_path))
    monkeypatch.setenv("INTELLECT_TASK_ID", "task-1")
    monkeypatch.setenv("INTELLECT_DATA_DIR", str(data))
    return data


def exchange(path: Path, *lines: bytes) -> list[dict]:  # type: ignore[type-arg]
    """Send raw lines on one connection; return the decoded replies."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        reader = sock.makefile("rb")
        replies = []
        for line in lines:
            sock.sendall(line + b"\n")
            replies.append(json.loads(reader.readline()))
        return replies


def file_ready(path: str, sha: str, units: int = 1, task_id: str = "task-1") -> bytes:
    return json.dumps(
        {"type": "file_ready", "task_id": task_id, "path": path, "sha256": sha, "work_units": units}
    ).encode()


def test_socket_is_private(bridge: TaskBridge) -> None:
    """Only the worker's user, and the group confined tasks run as when there is one, reach it."""
    socket_mode, folder = bridge.socket_path.stat(), bridge.socket_path.parent.stat()
    assert stat.S_ISSOCK(socket_mode.st_mode)
    if bridge.task_gid is None:
        assert (stat.S_IMODE(socket_mode.st_mode), stat.S_IMODE(folder.st_mode)) == (0o600, 0o700)
    else:
        assert (stat.S_IMODE(socket_mode.st_mode), stat.S_IMODE(folder.st_mode)) == (0o660, 0o710)
        assert socket_mode.st_gid == folder.st_gid == bridge.task_gid


def test_a_bridge_without_a_task_group_keeps_the_socket_to_its_user(tmp_path: Path) -> None:
    short = Path(tempfile.mkdtemp(prefix="irt-", dir="/tmp"))
    try:
        with TaskBridge(short / "sock" / "bridge.sock", tmp_path / "state") as server:
            assert stat.S_IMODE(server.socket_path.stat().st_mode) == 0o600
            assert stat.S_IMODE(server.socket_path.parent.stat().st_mode) == 0o700
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_client_reports_metrics_and_announces_files(bridge: TaskBridge, task: Path) -> None:
    bridge_client.report_metrics({"loss": 1.5, "reward": 0.25})
    bridge_client.report_metrics({"loss": 0.75})  # latest value per label wins
    assert bridge.metrics("task-1") == {"loss": 0.75, "reward": 0.25}
    out = task / "sub" / "rollouts.parquet"
    out.parent.mkdir()
    out.write_bytes(b"x" * 5000)
    bridge_client.announce_file(out, work_units=32)  # absolute host path: sent relative to the data dir
    [queued] = bridge.files.pending_upload()
    assert (queued.relative_path, queued.work_units, queued.size_bytes) == ("sub/rollouts.parquet", 32, 5000)
    assert queued.sha256 == hashlib.sha256(b"x" * 5000).hexdigest()
    assert queued.path == out.resolve()
    # The same content announced again (e.g. a restarted task) stays one entry: one work key on chain.
    bridge_client.announce_file("sub/rollouts.parquet", work_units=32)
    assert len(bridge.files.all()) == 1


def test_container_paths_map_to_the_host_data_dir(bridge: TaskBridge, task: Path) -> None:
    (task / "a.bin").write_bytes(b"abc")
    sha = hashlib.sha256(b"abc").hexdigest()
    assert exchange(bridge.socket_path, file_ready("/data/a.bin", sha)) == [{"ok": True, "error": None}]
    assert bridge.files.pending_upload()[0].path == (task / "a.bin").resolve()


def test_malformed_and_refused_messages_get_a_reason_and_the_server_keeps_serving(
    bridge: TaskBridge, task: Path
) -> None:
    (task / "ok.bin").write_bytes(b"ok")
    (task / "dir").mkdir()
    (task / "link").symlink_to("/etc/hostname")
    good_sha = hashlib.sha256(b"ok").hexdigest()
    cases = {
        b"{not json": "invalid message",
        b'{"type": "reboot", "task_id": "task-1"}': "invalid message",
        b'{"type": "metrics", "task_id": "task-1"}': "metrics",
        b'{"type": "metrics", "task_id": "task-1", "metrics": {"loss": "high"}}': "metrics.loss",
        b'{"type": "metrics", "task_id": "task-1", "metrics": {"loss": NaN}}': "not a finite number",
        b'{"type": "metrics", "task_id": "task-1", "metrics": {}, "extra": 1}': "extra",
        b'{"type": "metrics", "task_id": "other", "metrics": {"a": 1}}': "unknown task 'other'",
        file_ready("ok.bin", "ABC"): "sha256",
        file_ready("ok.bin", good_sha, units=-1): "work_units",
        file_ready("../../etc/hostname", good_sha): "outside the task's data directory",
        file_ready("/etc/hostname", good_sha): "outside the task's data directory",
        file_ready("link", good_sha): "outside the task's data directory",
        file_ready("missing.bin", good_sha): "no such file",
        file_ready("dir", good_sha): "not a regular file",
        file_ready("ok.bin", "0" * 64): "sha256 mismatch",
    }
    replies = exchange(bridge.socket_path, *cases)
    for (line, expected), reply in zip(cases.items(), replies, strict=True):
        assert reply["ok"] is False, line
        assert expected in reply["error"], (line, reply)
    assert bridge.files.pending_upload() == [] and bridge.metrics("task-1") == {}
    # Still serving, on the same connection and on a new one.
    assert exchange(bridge.socket_path, file_ready("ok.bin", good_sha))[0]["ok"] is True


def test_an_oversized_message_is_refused(bridge: TaskBridge, task: Path) -> None:
    line = b'{"type": "metrics", "task_id": "task-1", "metrics": {"' + b"a" * MAX_LINE + b'": 1}}'
    [reply] = exchange(bridge.socket_path, line)
    assert reply["ok"] is False and "longer than" in reply["error"]
    with pytest.raises(bridge_client.BridgeError, match="exceeds"):
        bridge_client.report_metrics({"a" * MAX_LINE: 1})
    bridge_client.report_metrics({"after": 1})
    assert bridge.metrics("task-1") == {"after": 1.0}


def test_announced_files_survive_a_worker_restart(bridge: TaskBridge, task: Path, short_tmp: Path) -> None:
    (task / "one.bin").write_bytes(b"1")
    (task / "two.bin").write_bytes(b"2")
    bridge_client.announce_file(task / "one.bin", work_units=1)
    bridge_client.announce_file(task / "two.bin", work_units=2)
    bridge.stop()
    assert not bridge.socket_path.exists()
    restarted = TaskBridge(bridge.socket_path, short_tmp / "state")
    pending = restarted.files.pending_upload()
    assert [p.relative_path for p in pending] == ["one.bin", "two.bin"]
    uploaded = restarted.files.mark_uploaded(pending[0].id, "upload-7")
    assert uploaded.upload_ref == "upload-7" and uploaded.uploaded_at is not None
    assert [p.relative_path for p in restarted.files.pending_upload()] == ["two.bin"]
    assert [p.id for p in restarted.files.pending_submission()] == [pending[0].id]
    restarted.files.mark_submitted(pending[0].id, "0x" + "ab" * 32)
    assert restarted.files.pending_submission() == []


def test_socket_lifecycle_guards(short_tmp: Path) -> None:
    with pytest.raises(ValueError, match="longer than"):
        TaskBridge(short_tmp / ("x" * 120) / "bridge.sock", short_tmp / "state")
    path = short_tmp / "s" / "bridge.sock"
    path.parent.mkdir()
    path.write_text("not a socket")
    with pytest.raises(FileExistsError, match="not a socket"):
        TaskBridge(path, short_tmp / "state").start()
    path.unlink()
    # A socket left behind by a crashed worker is replaced.
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()
    with TaskBridge(path, short_tmp / "state") as server:
        server.allow_task("t", short_tmp)
        assert exchange(path, b'{"type": "metrics", "task_id": "t", "metrics": {"a": 2}}')[0]["ok"]


def test_client_cli(bridge: TaskBridge, task: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bridge_client.main(["metrics", "tokens=12", "loss=0.5"]) == 0
    assert bridge.metrics("task-1") == {"tokens": 12.0, "loss": 0.5}
    (task / "f.bin").write_bytes(b"f")
    assert bridge_client.main(["file", str(task / "f.bin"), "--work-units", "3"]) == 0
    assert bridge.files.pending_upload()[0].work_units == 3
    assert bridge_client.main(["file", "nope.bin"]) == 1
    assert "nope.bin" in capsys.readouterr().err
    assert bridge_client.main(["dance"]) == 2


def test_a_group_member_gets_its_link_commitment_signed_by_the_node_key_it_never_holds(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sign_link`: the worker signs the fixed claim text (task, group, batch, link, digest) with the node
    key; a task it does not run, a malformed claim and a worker without a key are refused."""
    from intellect.identity import Wallet
    from workloads.pipeline.commit import BridgeSigner, LinkClaim, signed_by

    node = Wallet.create()
    with TaskBridge(short_tmp / "sock" / "b.sock", short_tmp / "state", None, node.sign_message) as bridge:
        data = short_tmp / "data"
        data.mkdir()
        bridge.allow_task("task-1", data, "/data")
        monkeypatch.setenv("INTELLECT_SOCKET_PATH", str(bridge.socket_path))
        monkeypatch.setenv("INTELLECT_TASK_ID", "task-1")
        claim = LinkClaim("task-1", "group-7", 3, 0, 1, "sent", "ab" * 32)
        signature = BridgeSigner().sign(claim)
        assert signed_by(claim, signature, node.address)
        later = LinkClaim("task-1", "group-7", 4, 0, 1, "sent", "ab" * 32)
        assert not signed_by(later, signature, node.address)  # bound to its batch
        claim_of = {"type": "sign_link", "group_id": "g", "batch": 1, "sender": 0, "receiver": 1,
                    "role": "sent"}
        other = json.dumps({**claim_of, "task_id": "task-2", "sha256": "ab" * 32}).encode()
        free_text = json.dumps({**claim_of, "task_id": "task-1", "sha256": "send 1 ETH"}).encode()
        refused = exchange(bridge.socket_path, other, free_text)
        assert not refused[0]["ok"] and "not running it" in refused[0]["error"]
        assert not refused[1]["ok"] and "sha256" in refused[1]["error"] and "signature" not in refused[1]
    with TaskBridge(short_tmp / "sock" / "c.sock", short_tmp / "state2") as keyless:
        keyless.allow_task("task-1", short_tmp / "data", "/data")
        monkeypatch.setenv("INTELLECT_SOCKET_PATH", str(keyless.socket_path))
        with pytest.raises(bridge_client.BridgeError, match="without its node key"):
            BridgeSigner().sign(LinkClaim("task-1", "g", 1, 0, 1, "sent", "ab" * 32))
