from __future__ import annotations

from pathlib import Path

import pytest

from intellect.identity import IdentityError, Wallet
from intellect.wire.heartbeat import TaskStatus
from intellect.wire.tasks import TaskState
from worker.keys import keystore_path, load_keys
from worker.settings import WorkerSettings
from worker.state import StateStore, WorkerState


def test_state_round_trip_and_atomic_write(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "w" / "state.json")
    assert store.load() == WorkerState()
    state = WorkerState(node_address="0xabc", pool_id=3, pool_joined=True, orchestrator_url="http://o",
                        last_task=TaskStatus(task_id="t1", state=TaskState.RUNNING))
    store.save(state)
    again = StateStore(tmp_path / "w" / "state.json").load()
    assert again.pool_joined and again.orchestrator_url == "http://o"
    assert again.last_task is not None and again.last_task.state == TaskState.RUNNING
    assert [p.name for p in (tmp_path / "w").iterdir()] == ["state.json"]  # no temp files left behind
    store.update(pool_joined=False)
    assert store.load().pool_joined is False


def test_corrupt_state_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="corrupt worker state file"):
        StateStore(path).load()


def test_keystores_are_created_once_and_reloaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTELLECT_KEYSTORE_PASSPHRASE", "pw")
    settings = WorkerSettings(state_dir=tmp_path)
    first = load_keys(settings, create=True)
    second = load_keys(settings, create=False)
    assert (first.provider.address, first.node.address) == (second.provider.address, second.node.address)
    assert first.provider.address != first.node.address
    assert keystore_path(settings, "node").stat().st_mode & 0o777 == 0o600
    assert first.node.private_key_hex()[2:] not in keystore_path(settings, "node").read_text()
    monkeypatch.setenv("INTELLECT_KEYSTORE_PASSPHRASE", "wrong")
    with pytest.raises(IdentityError, match="wrong passphrase"):
        load_keys(settings, create=False)


def test_missing_keys_are_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTELLECT_KEYSTORE_PASSPHRASE", "pw")
    with pytest.raises(IdentityError, match="wallet create"):
        load_keys(WorkerSettings(state_dir=tmp_path), create=False)


def test_env_keys_win_over_keystores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    provider, node = Wallet.create(), Wallet.create()
    monkeypatch.setenv("INTELLECT_WORKER_PROVIDER_KEY", provider.private_key_hex())
    monkeypatch.setenv("INTELLECT_WORKER_NODE_KEY", node.private_key_hex())
    keys = load_keys(WorkerSettings(state_dir=tmp_path), create=True)
    assert (keys.provider.address, keys.node.address) == (provider.address, node.address)
    assert not (tmp_path / "keys").exists()


def test_settings_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTELLECT_WORKER_POOL_ID", "7")
    monkeypatch.setenv("INTELLECT_WORKER_HEARTBEAT_INTERVAL", "2.5")
    assert WorkerSettings().pool_id == 7 and WorkerSettings().heartbeat_interval == 2.5
    assert WorkerSettings(pool_id=9).pool_id == 9
    with pytest.raises(ValueError, match="http"):
        WorkerSettings(rpc_url="localhost:8545")
