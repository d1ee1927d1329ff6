"""Freshness judged at submission (issue 37.4): the trainer says which step was in force at a given
time (`GET /step?at=`), from the manifests it keeps for every step, and the validator's watcher asks
it for the block's time, so a validator that reads the chain minutes late, or restarts, stores the
same steps for a submission as one that read it at once."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.testing import ServerThread
from tests.support.trainer_view import TrainerView
from validator.watcher import CLOCK_GRACE_SECONDS, steps_at_submission, trainer_step
from workloads.trainer.checkpoints import CheckpointDir, Manifest
from workloads.trainer.step_counter import create_app


def write_steps(checkpoints: CheckpointDir, times: list[float]) -> None:
    """Manifests of steps 1.. written at `times` (what the trainer keeps even after pruning weights)."""
    for step, created in enumerate(times, start=1):
        manifest = Manifest(step=step, parent_step=step - 1, sha256="ab" * 32, config_hash="c",
                            created_at=created)
        checkpoints.manifest_path(step).write_text(manifest.model_dump_json())


def test_the_step_in_force_at_a_time_comes_from_the_trainers_history(tmp_path: Path) -> None:
    now = time.time()
    checkpoints = CheckpointDir(tmp_path / "trainer")
    # steps 1..10 written a minute apart, the last one a minute ago
    times = [now - 60 * (11 - s) for s in range(1, 11)]
    write_steps(checkpoints, times)
    assert checkpoints.step_at(times[0] - 1) == 0  # before the first checkpoint: the base model
    assert checkpoints.step_at(times[3]) == 4 and checkpoints.step_at(times[3] + 59) == 4
    with ServerThread(create_app(TrainerView(checkpoints, step=10))) as trainer:
        url = f"{trainer.url}/step"
        assert trainer_step(url) == 10
        assert trainer_step(url, times[4] + 1) == 5
        assert trainer_step(url, now + 3600) == 10  # a time ahead of the trainer: its step now
        # a submission made just after step 5 was written: read at once, or five minutes later
        # (the trainer has moved on by then), the step it is judged "behind" against is the same
        block = int(times[4]) + 1 + CLOCK_GRACE_SECONDS
        timely = steps_at_submission(url, {block})
        later_view = TrainerView(checkpoints, step=15)
        write_steps(checkpoints, times + [now + k for k in range(1, 6)])  # steps 11..15 since then
        with ServerThread(create_app(later_view)) as moved_on:
            late = steps_at_submission(f"{moved_on.url}/step", {block})
        assert timely[1] == late[1] == {block: 5}
        # "ahead" is judged on the step when the validator read it: never below the one at submission
        assert timely[0] == 10 and late[0] == 15


def test_an_unreachable_trainer_gives_no_steps(tmp_path: Path) -> None:
    assert steps_at_submission("http://127.0.0.1:9/step", {1_700_000_000}) == (None, {1_700_000_000: None})
    assert steps_at_submission(None, {1}) == (None, {1: None})
