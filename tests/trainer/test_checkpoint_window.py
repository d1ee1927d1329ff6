"""Paid to the end (issue 54.7): the checkpoints that files still waiting for judgement name stay on the
trainer's disk and served by URL until those files' vote window has passed, also older than the
`keep` newest and also after the trainer's last step; a lagging validator finds them by step
(`GET /checkpoints/{step}`, not only in `/step`'s listing) and checks their sha256. Before, a
validator that reached the last steps' files after the trainer had stopped (or moved `keep` steps
on) gave honest files "no checkpoint of step N can be had from the trainer": not paid."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.testing import ServerThread, free_port
from tests.support.trainer_view import TrainerView
from validator.checkpoints import TrainerCheckpoints
from workloads.trainer.checkpoints import SUBMISSION_GRACE_SECONDS, CheckpointDir, Manifest
from workloads.trainer.step_counter import create_app, linger

WINDOW = 300.0  # the devnet demo's vote window
LEVEL = 1  # async level: files naming step s's checkpoint may be submitted until step s + 3 is written


def weights(step: int) -> bytes:
    return f"weights of step {step}".encode() * 500


def write_step(checkpoints: CheckpointDir, step: int, created: float, data: bytes | None = None) -> str:
    """A step as the trainer writes it (weights, sidecar, state, manifest last) at time `created`."""
    data = weights(step) if data is None else data
    sha = hashlib.sha256(data).hexdigest()
    checkpoints.weights(step).write_bytes(data)
    (checkpoints.root / f"step_{step}.safetensors.sha256").write_text(f"{sha}  step_{step}.safetensors\n")
    checkpoints.state_path(step).write_bytes(b"optimizer and RNG")
    manifest = Manifest(step=step, parent_step=step - 1, sha256=sha, config_hash="c", created_at=created)
    checkpoints.manifest_path(step).write_text(manifest.model_dump_json())
    return sha


def run_of_ten(root: Path, now: float, keep: int = 2) -> CheckpointDir:
    """Steps 1..10, the last one now: 7 at now - 359, so step 4 (7 = 4 + 2 x 1 + 1) may be judged for
    one more second; 1..3 are past their window, 5..8 well within it, 9 and 10 the newest `keep`."""
    checkpoints = CheckpointDir(root, keep, vote_window=WINDOW, async_level=LEVEL)
    times = {s: now - 400 - 10 * (7 - s) for s in range(1, 7)}
    times |= {7: now - (SUBMISSION_GRACE_SECONDS + WINDOW) + 1, 8: now - 200, 9: now - 100, 10: now}
    for step in range(1, 11):
        write_step(checkpoints, step, times[step])
    return checkpoints


def test_a_checkpoint_stays_while_files_naming_it_may_be_judged(tmp_path: Path) -> None:
    now = time.time()
    checkpoints = run_of_ten(tmp_path / "trainer", now)
    assert checkpoints.kept_until(3) < now < checkpoints.kept_until(4) <= now + 1.01
    assert checkpoints.kept_until(8) == float("inf")  # step 11 not written: files may still name 8
    assert checkpoints.prune(now) == [1, 2, 3]
    assert checkpoints.steps() == list(range(4, 11))  # older than keep (2) but within the window
    assert checkpoints.all_steps() == list(range(1, 11))  # the manifests stay (the reward curve)
    assert not checkpoints.weights(3).exists() and not checkpoints.state_path(3).exists()
    # the judges need the weights alone: the optimizer state goes with `keep` (a resume reads the newest)
    assert checkpoints.weights(5).exists() and not checkpoints.state_path(5).exists()
    assert checkpoints.resumable() == [9, 10]
    assert checkpoints.prune(now + 2) == [4]  # its window has passed
    # a reader of the folder (no window) keeps the newest `keep` alone, as before
    plain = run_of_ten(tmp_path / "plain", now)
    assert CheckpointDir(plain.root, keep=2).prune(now) == list(range(1, 9))


def test_a_lagging_validator_fetches_an_old_checkpoint_and_checks_its_sha256(tmp_path: Path) -> None:
    now = time.time()
    checkpoints = run_of_ten(tmp_path / "trainer", now)
    checkpoints.prune(now)
    view = TrainerView(checkpoints, step=10, async_level=LEVEL)
    with ServerThread(create_app(view)) as trainer:
        view.public_url = trainer.url
        listed = httpx.get(f"{trainer.url}/step").json()["checkpoints"]
        assert sorted(listed) == ["10", "9"]  # what workers may use now: step 5 is not listed
        cache = TrainerCheckpoints(f"{trainer.url}/step", tmp_path / "validator", keep=16)
        found = cache.checkpoint_for(5)
        assert found is not None
        path, sha = found
        assert path.read_bytes() == weights(5) and sha == hashlib.sha256(weights(5)).hexdigest()
        # past its window the trainer dropped it: nothing to fetch, and the lookup says so
        assert cache.checkpoint_for(2) is None
        gone = httpx.get(f"{trainer.url}/checkpoints/2")
        assert gone.status_code == 404 and "no checkpoint of step 2" in gone.text
        # bytes that are not the ones the trainer's manifest names are never used
        checkpoints.weights(6).write_bytes(b"not the weights of step 6")
        assert cache.checkpoint_for(6) is None
        assert not list((tmp_path / "validator").glob("*.part"))
        assert len(list((tmp_path / "validator").glob("*.safetensors"))) == 1


def test_a_trainer_past_its_last_step_serves_on_until_nobody_asked_for_a_window(tmp_path: Path) -> None:
    now = time.time()
    checkpoints = run_of_ten(tmp_path / "trainer", now)
    view = TrainerView(checkpoints, step=10, async_level=LEVEL)  # 10: its last step
    app = create_app(view)
    quiet = 1.5
    with ServerThread(app) as trainer:
        view.public_url = trainer.url
        stop = threading.Event()
        asked = lambda: app.state.last_asked  # noqa: E731
        serving = threading.Thread(target=linger, args=(checkpoints, asked, quiet, stop, 0.05))
        serving.start()
        cache = TrainerCheckpoints(f"{trainer.url}/step", tmp_path / "validator")
        asked_until = time.time() + 2 * quiet
        while time.time() < asked_until:  # workers polling the step while the task runs
            assert httpx.get(f"{trainer.url}/step").status_code == 200
            time.sleep(0.2)
        assert serving.is_alive()  # asked for longer than `quiet` since the last step: still serving
        found = cache.checkpoint_for(5)  # a validator judging a file of step 5 after the last step
        assert found is not None and found[0].read_bytes() == weights(5)
        assert 4 not in checkpoints.steps()  # its window passed meanwhile: dropped as during training
        last = app.state.last_asked
        serving.join(timeout=quiet + 5)
        assert not serving.is_alive()
        assert time.time() - last >= quiet  # only once nobody had asked for the window
        # a stop (SIGTERM) ends it at once, however recently it was asked
        stop.set()
        started = time.monotonic()
        linger(checkpoints, time.time, 3600.0, stop)
        assert time.monotonic() - started < 1.0


@pytest.mark.slow  # another interpreter (torch, the model)
def test_intellect_train_serves_its_checkpoints_after_max_steps(tmp_path: Path) -> None:
    from workloads.trainer.loop import Trainer
    from workloads.trainer.settings import TrainerSettings
    from workloads.trainer.sources import LocalDirSource

    rollouts, output = tmp_path / "rollouts", tmp_path / "trainer"
    rollouts.mkdir()
    settings = TrainerSettings.for_cpu_demo(output_dir=output, rollouts=str(rollouts), device="cpu")
    made = Trainer(settings, LocalDirSource(rollouts))
    made.step = 1
    made.save({})  # a real step 2 (weights, optimizer state) to resume from: the run's last step
    write_step(made.checkpoints, 1, made.checkpoints.manifest(2).created_at - 5)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "workloads.trainer", "--cpu-demo", "--rollouts", str(rollouts),
         "--output-dir", str(output), "--port", str(port), "--max-steps", "2", "--keep", "1",
         "--async-level", "0", "--vote-window-seconds", "600", "--device", "cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{url}/health", timeout=2).json().get("step") == 2:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        cache = TrainerCheckpoints(f"{url}/step", tmp_path / "validator")
        found = cache.checkpoint_for(1)  # older than keep (1), not listed (async level 0), judged later
        assert found is not None and found[0].read_bytes() == weights(1)
        time.sleep(1.0)
        assert proc.poll() is None  # past --max-steps, still serving
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out = proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out = proc.communicate()[0]
    assert proc.returncode == 0, out[-3000:]
    assert "took its last step (2); serving its checkpoints" in out
