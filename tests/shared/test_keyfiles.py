"""Keys by reference (`file:PATH`): what services accept so that no key sits in an environment."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from intellect.identity import Wallet
from intellect.keyfiles import write_key_file
from orchestrator.settings import OrchestratorSettings
from validator.settings import ValidatorSettings
from worker.settings import WorkerSettings

KEY = "0x" + "4c" * 32


def test_every_service_reads_a_key_from_a_private_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = write_key_file(tmp_path / "keys" / "node.key", KEY)
    assert reference == f"file:{tmp_path / 'keys' / 'node.key'}"
    assert (tmp_path / "keys" / "node.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "keys").stat().st_mode & 0o777 == 0o700
    monkeypatch.setenv("INTELLECT_WORKER_NODE_KEY", reference)
    monkeypatch.setenv("INTELLECT_ORCH_MANAGER_KEY", reference)
    monkeypatch.setenv("INTELLECT_VALIDATOR_KEY", reference)
    secrets = [WorkerSettings().node_key, OrchestratorSettings().manager_key, ValidatorSettings().key]
    assert [s.get_secret_value() if s else None for s in secrets] == [KEY] * 3
    assert Wallet.from_key(KEY).address == Wallet.from_key(secrets[0].get_secret_value()).address  # type: ignore[union-attr]


def test_a_raw_key_still_works(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTELLECT_WORKER_NODE_KEY", KEY)
    assert WorkerSettings().node_key.get_secret_value() == KEY  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("mode", "content", "message"),
    [
        (0o644, KEY, "can be read by other users (mode 644): run `chmod 600"),
        (0o640, KEY, "can be read by other users (mode 640)"),
        (0o600, "", "is empty"),
        (0o600, "x" * 5000, "a private key file holds one key"),
    ],
)
def test_an_unsafe_or_broken_key_file_is_refused_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int, content: str, message: str
) -> None:
    path = tmp_path / "node.key"
    path.write_text(content)
    path.chmod(mode)
    monkeypatch.setenv("INTELLECT_WORKER_NODE_KEY", f"file:{path}")
    with pytest.raises(ValidationError) as caught:
        WorkerSettings()
    assert message in str(caught.value) and str(path) in str(caught.value)


def test_a_missing_key_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTELLECT_VALIDATOR_KEY", f"file:{tmp_path / 'absent.key'}")
    with pytest.raises(ValidationError, match="absent.key: No such file or directory"):
        ValidatorSettings()
