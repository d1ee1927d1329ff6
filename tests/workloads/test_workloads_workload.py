"""The inference workload end to end: standalone files, the bridge, the step counter and
checkpoints over real HTTP, the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import structlog
import structlog.testing
import torch
from safetensors.torch import save_file

from tests.support.loopback import accept_each, served_folder
from workloads.datasets import load_dataset
from workloads.inference.checkpoints import CheckpointError, CheckpointStore
from workloads.inference.selection import plan_batch
from workloads.inference.settings import InferenceSettings
from workloads.inference.workload import InferenceWorkload
from workloads.model.loading import load_model, load_tokenizer
from workloads.rollouts import read_rollouts

REPO = Path(__file__).resolve().parents[2]
NODE = "0x5aeda56215b167893e80b4fe645ba6d5bab767de"


def settings(tmp_path: Path, **kw) -> InferenceSettings:
    base = dict(
        node_address=NODE,
        output_dir=tmp_path / "out",
        batch_size=3,
        n=2,
        max_new_tokens=12,
        max_batches=2,
        checkpoint_cache=tmp_path / "ckpt",
    )
    base.update(kw)
    return InferenceSettings(**base)


def test_standalone_writes_reproducible_files(tmp_path, monkeypatch):
    monkeypatch.delenv("INTELLECT_SOCKET_PATH", raising=False)
    reports = []
    assert InferenceWorkload(settings(tmp_path, step=4)).run(reports.append) == 2
    files = sorted((tmp_path / "out").glob("*.parquet"))
    assert [Path(r.path) for r in reports] == files and len(files) == 2
    records, tok = load_dataset("demo"), load_tokenizer("tiny")
    for counter, path in enumerate(files, start=1):
        rows, info = read_rollouts(path)
        assert (info.step, info.batch_counter, info.group_size, info.node_address) == (4, counter, 2, NODE)
        plan = plan_batch(NODE, counter, len(records), 3, 2, [8])
        assert [r.seed for r in rows] == plan.seeds
        assert [r.problem_id for r in rows] == [records[i].problem_id for i in plan.indexes for _ in range(2)]
        assert [r.input_tokens for r in rows] == [
            tok(records[i].prompt)["input_ids"] for i in plan.indexes for _ in range(2)
        ]
        assert all(r.step == 4 and len(r.proofs) > 0 or len(r.output_tokens) == 1 for r in rows)
        for g in range(0, len(rows), 2):  # group advantages sum to ~0
            assert abs(rows[g].advantages + rows[g + 1].advantages) < 1e-4
    assert reports[0].work_units == sum(len(r.output_tokens) for r in read_rollouts(files[0])[0])
    # A second run of the same node, step and counters gives the same files, bit for bit.
    again = InferenceWorkload(settings(tmp_path / "b", step=4))
    again.run()
    for path in files:
        twin = tmp_path / "b" / "out" / path.name
        assert read_rollouts(twin)[0] == read_rollouts(path)[0]


class BridgeServer:
    """A worker-side stand-in for the socket bridge: real unix socket, one JSON line per message."""

    def __init__(self, path: Path):
        self.path, self.messages = path, []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        threading.Thread(target=accept_each, args=(self.sock, self._answer), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            line = conn.makefile("rb").readline()
            self.messages.append(json.loads(line))
            conn.sendall(b'{"ok": true}\n')


def test_bridge_announces_files_and_metrics(tmp_path, monkeypatch):
    server = BridgeServer(tmp_path / "bridge.sock")
    monkeypatch.setenv("INTELLECT_SOCKET_PATH", str(server.path))
    monkeypatch.setenv("INTELLECT_TASK_ID", "task-7")
    reports = []
    InferenceWorkload(settings(tmp_path, max_batches=1)).run(reports.append)
    server.sock.close()
    files = [m for m in server.messages if m["type"] == "file_ready"]
    metrics = [m for m in server.messages if m["type"] == "metrics"]
    assert len(files) == 1 and len(metrics) == 1
    path = Path(reports[0].path)
    assert files[0]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert files[0]["work_units"] == sum(len(r.output_tokens) for r in read_rollouts(path)[0]) > 0
    assert files[0]["task_id"] == "task-7"
    assert metrics[0]["metrics"]["tokens_per_second"] > 0
    assert 0 <= metrics[0]["metrics"]["task_reward_mean"] <= 1


@pytest.fixture
def http_dir(tmp_path):
    with served_folder(tmp_path / "www") as url:
        yield tmp_path / "www", url


def _publish(root: Path, step: int, scale: float) -> None:
    model = load_model("tiny")
    state = {
        k: (v.float() * scale).to(torch.bfloat16).contiguous()
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }
    path = root / f"step_{step}.safetensors"
    save_file(state, str(path))
    (root / f"step_{step}.safetensors.sha256").write_text(
        hashlib.sha256(path.read_bytes()).hexdigest() + "\n"
    )


def test_follows_step_counter_and_loads_http_checkpoints(tmp_path, http_dir, monkeypatch):
    monkeypatch.delenv("INTELLECT_SOCKET_PATH", raising=False)
    root, url = http_dir
    (root / "step").write_text('{"step": 3}')
    _publish(root, 1, 1.01)
    s = settings(
        tmp_path,
        step_url=f"{url}/step",
        checkpoint_source=f"{url}/step_{{step}}.safetensors",
        async_level=2,
        max_batches=1,
    )
    work = InferenceWorkload(s)
    reports = []
    work.run(reports.append)
    assert reports[0].step == 3 and reports[0].checkpoint_step == 1  # within async level 2
    base = load_model("tiny").state_dict()["model.norm.weight"].float()
    torch.testing.assert_close(
        work.model.state_dict()["model.norm.weight"].float(), base * 1.01, rtol=1e-2, atol=0
    )
    # A newer step: batch counter restarts at 1; step 3's checkpoint supersedes step 1's.
    (root / "step").write_text('{"step": 4}')
    _publish(root, 3, 1.02)
    _publish(root, 2, 1.015)
    r2 = work.run_batch()
    assert (r2.step, r2.batch_counter, r2.checkpoint_step) == (4, 2, 3)  # counters go on across steps
    _publish(root, 4, 1.03)
    _publish(root, 5, 1.04)
    (root / "step").write_text('{"step": 5}')
    assert work.run_batch().checkpoint_step == 5
    assert work.store.versions() == [1, 3, 5]
    _publish(root, 6, 1.05)
    (root / "step").write_text('{"step": 6}')
    assert work.run_batch().checkpoint_step == 6
    assert work.store.versions() == [3, 5, 6]  # at most async level + 1 versions kept


def test_step_beyond_async_level_waits(tmp_path, http_dir):
    root, url = http_dir
    (root / "step").write_text('{"step": 9}')
    work = InferenceWorkload(
        settings(tmp_path, step_url=f"{url}/step", checkpoint_source=f"{url}/step_{{step}}.safetensors")
    )
    assert work.run_batch() is None  # no checkpoint in [7, 9]: nothing generated with a stale policy
    assert not list((tmp_path / "out").glob("*.parquet"))


def test_a_source_that_never_has_the_checkpoint_is_a_warning_naming_url_and_status(tmp_path, http_dir):
    """A relay has no `step_{N}.safetensors` (it serves `/v{N}/…`): every candidate answers 404. The
    wait says so at warning level, with the URLs asked and their status, not a silent info line."""
    root, url = http_dir
    (root / "step").write_text('{"step": 5}')
    work = InferenceWorkload(settings(
        tmp_path, step_url=f"{url}/step", checkpoint_source=f"{url}/step_{{step}}.safetensors", async_level=1,
    ))  # fmt: skip
    with structlog.testing.capture_logs() as logs:
        assert work.run_batch() is None
        assert work.run_batch() is None  # the same answers again: not warned twice
    waits = [e for e in logs if e["event"] == "no checkpoint within the async level yet"]
    assert [e["log_level"] for e in waits] == ["warning", "info"]
    assert waits[0]["tried"] == [f"GET {url}/step_{n}.safetensors.sha256: HTTP 404" for n in (5, 4)]


def test_unreachable_broadcast_relays_are_named_in_the_warning(tmp_path, http_dir):
    root, url = http_dir
    (root / "step").write_text('{"step": 3}')
    dead = "http://127.0.0.1:1"
    work = InferenceWorkload(settings(
        tmp_path, step_url=f"{url}/step", checkpoint_source=f"broadcast:{dead}", async_level=0,
    ))  # fmt: skip
    with structlog.testing.capture_logs() as logs:
        assert work.run_batch() is None
    (wait,) = [e for e in logs if e["event"] == "no checkpoint within the async level yet"]
    assert wait["log_level"] == "warning"
    (tried,) = wait["tried"]
    assert dead in tried and "HTTP 404" not in tried  # why the relay could not be asked, by URL


def test_checkpoint_sha256_mismatch_is_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "step_1.safetensors").write_bytes(b"weights")
    (src / "step_1.safetensors.sha256").write_text("0" * 64)
    store = CheckpointStore(str(src / "step_{step}.safetensors"), tmp_path / "cache", keep=2)
    with pytest.raises(CheckpointError, match="sha256"):
        store.fetch(1)
    assert store.fetch(2) is None
    assert store.versions() == []


@pytest.mark.slow  # starts other interpreters (see tests/conftest.py)
def test_cli_help_and_bad_flags():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ok = subprocess.run(
        [sys.executable, "-m", "workloads.inference", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert ok.returncode == 0 and "--batch-size" in ok.stdout and "--step-url" in ok.stdout
    assert ok.stdout.startswith("usage: intellect-infer ")  # the command users type, not the module
    bad = subprocess.run(
        [sys.executable, "-m", "workloads.inference", "--node-address", "nothex", "--max-batches", "1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 2 and "node_address" in bad.stderr


@pytest.mark.slow  # starts other interpreters (see tests/conftest.py)
def test_cli_runs_standalone_with_json(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "INTELLECT_SOCKET_PATH"}
    env["INTELLECT_INFER_BATCH_SIZE"] = "2"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "workloads.inference",
            "--max-batches",
            "1",
            "-n",
            "2",
            "--max-new-tokens",
            "8",
            "--output-dir",
            str(tmp_path),
            "--json-output",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["rows"] == 4 and Path(report["path"]).exists()


def test_waits_for_an_unavailable_step_counter(tmp_path, http_dir, monkeypatch):
    monkeypatch.delenv("INTELLECT_SOCKET_PATH", raising=False)
    root, url = http_dir  # /step answers 404 until the trainer publishes it
    timer = threading.Timer(0.5, lambda: (root / "step").write_text('{"step": 2}'))
    timer.start()
    reports = []
    InferenceWorkload(settings(tmp_path, step_url=f"{url}/step", poll_seconds=0.1, max_batches=1)).run(
        reports.append
    )
    timer.join()
    assert [r.step for r in reports] == [2]


def test_files_per_step_pauses_until_the_trainer_moves_on(tmp_path, http_dir, monkeypatch):
    monkeypatch.delenv("INTELLECT_SOCKET_PATH", raising=False)
    root, url = http_dir
    (root / "step").write_text('{"step": 0}')
    moved_at: list[float] = []

    def advance() -> None:
        moved_at.append(time.monotonic())
        (root / "step").write_text('{"step": 1}')

    timer = threading.Timer(1.5, advance)
    timer.start()
    reports = []
    run = settings(tmp_path, step_url=f"{url}/step", poll_seconds=0.1, max_batches=2, files_per_step=1)
    InferenceWorkload(run).run(lambda r: reports.append((r, time.monotonic())))
    timer.join()
    # one file for step 0, then nothing until the step moved, then one for step 1
    assert [r.step for r, _ in reports] == [0, 1]
    assert reports[1][1] >= moved_at[0]


def test_files_per_step_never_stalls_a_step_for_good(tmp_path, http_dir, monkeypatch):
    """A step the trainer cannot finish (too few informative groups) still gets one more file per
    `step_patience_seconds` from each worker."""
    monkeypatch.delenv("INTELLECT_SOCKET_PATH", raising=False)
    root, url = http_dir
    (root / "step").write_text('{"step": 0}')
    stamps: list[float] = []
    run = settings(tmp_path, step_url=f"{url}/step", poll_seconds=0.1, max_batches=2, files_per_step=1,
                   step_patience_seconds=1.0)  # fmt: skip
    InferenceWorkload(run).run(lambda r: stamps.append(time.monotonic()))
    assert len(stamps) == 2 and stamps[1] - stamps[0] >= 1.0
