"""`intellect-train` refuses a bad start before it loads a model: one line naming what to fix and a
non-zero exit, never a trainer running on without its step counter or into a folder made of a typo."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from workloads.trainer.__main__ import main


def test_rollouts_neither_url_nor_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    for spec in ("htp:/bad", str(tmp_path / "nonexistent")):
        assert main(["--rollouts", spec, "--port", "0", "--output-dir", str(tmp_path / "ck")]) == 2
        err = capsys.readouterr().err
        assert f"error: --rollouts '{spec}' is neither a validator URL" in err
        assert "Traceback" not in err
    assert not (tmp_path / "htp:").exists()  # no folder made of the typo
    assert not (tmp_path / "nonexistent").exists()


def test_cpu_demo_is_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "usage: intellect-train" in out
    assert "--cpu-demo" in out


def test_cpu_demo_flag_applies_the_demo_settings_and_flags_beside_it_win() -> None:
    from pydantic_settings import CliApp

    from workloads.trainer.settings import TrainerSettings

    base = CliApp.run(TrainerSettings, cli_args=["--cpu-demo", "--lr", "0.01"])
    settings = TrainerSettings.for_cpu_demo(**base.model_dump(exclude_unset=True))
    shown = (settings.cpu_demo, settings.lr, settings.minibatch_rows, settings.group_size)
    assert shown == (True, 0.01, 32, 4)


@pytest.mark.slow
def test_a_taken_port_stops_the_trainer(tmp_path: Path) -> None:
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    (tmp_path / "rollouts").mkdir()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "workloads.trainer", "--cpu-demo",
             "--rollouts", str(tmp_path / "rollouts"),
             "--output-dir", str(tmp_path / "ck"), "--port", str(port)],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )  # fmt: skip
    finally:
        taken.close()
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"error: cannot serve the step counter on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "ck").exists()  # stopped before training into its folder


def test_nproc_checks_the_port_before_it_starts_any_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--nproc 2` refuses a taken step-counter port itself, before torchrun starts ranks that would load
    the model and then fail on rank 0 alone."""
    taken = socket.create_server(("127.0.0.1", 0))
    (tmp_path / "rollouts").mkdir()
    try:
        port = str(taken.getsockname()[1])
        code = main(["--nproc", "2", "--rollouts", str(tmp_path / "rollouts"),
                     "--output-dir", str(tmp_path / "ck"), "--port", port])  # fmt: skip
    finally:
        taken.close()
    assert code == 1
    assert "cannot serve the step counter" in capsys.readouterr().err


def test_nproc_is_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "--nproc" in out and "torchrun" in out and "--max-restarts" in out
