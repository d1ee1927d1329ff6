"""The trainer's SDK (`intellect.client`) and `intellect task …` against a live orchestrator (uvicorn
thread, real Redis, real chain): token and signed-request auth, the server's reasons carried in the
exceptions, retries across an orchestrator restart, waits that time out with what they saw."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "uploads"))

from uploads_world import Orchestrator  # noqa: E402

from devnet.cli import app as intellect_app  # noqa: E402
from intellect.client import OrchestratorClient, TaskApiError, TaskTimeout  # noqa: E402
from intellect.identity import Wallet  # noqa: E402

SPEC = {"name": "sdk-test", "image": "intellect-test:latest", "cmd": ["print:hi", "exit:0"],
        "env_vars": {"MODE": "test"}}  # fmt: skip


@pytest.fixture(scope="module")
def orch(devnet, redis_url, tmp_path_factory):  # noqa: ANN001, ANN201
    trainer = Wallet.create()
    server = Orchestrator(devnet, redis_url, tmp_path_factory.mktemp("orch"),
                          admin_signers=[trainer.address]).start()  # fmt: skip
    server.trainer = trainer  # type: ignore[attr-defined]
    yield server
    server.stop()


def test_submit_list_get_status_delete_with_the_token(orch: Orchestrator) -> None:
    with OrchestratorClient(orch.url, token=orch.token) as client:
        task = client.submit(SPEC)
        assert task.spec.name == "sdk-test" and task.spec.env_vars == {"MODE": "test"}
        assert task.id in [t.id for t in client.list()]
        assert client.get(task.id).spec.cmd == ["print:hi", "exit:0"]
        progress = client.status(task.id)
        assert progress.task.id == task.id and progress.nodes == []  # nobody runs it yet
        assert client.logs(task.id) == {}
        with pytest.raises(TaskTimeout, match="did not reach running on 1 node") as waited:
            client.wait(task.id, "running", timeout=0.5, poll=0.1)
        assert "no node reports it" in waited.value.reason
        assert client.delete(task.id).deleted
        assert task.id not in [t.id for t in client.list()]
        assert task.id in [t.id for t in client.list(include_deleted=True)]
        with pytest.raises(TaskApiError, match="was deleted") as gone:  # deleted is gone, as in the list
            client.get(task.id)
        assert gone.value.status == 404 and client.get(task.id, include_deleted=True).deleted


def test_errors_carry_the_servers_reason(orch: Orchestrator) -> None:
    with OrchestratorClient(orch.url, token=orch.token) as client:
        with pytest.raises(TaskApiError) as bad:
            client.submit({"name": "no image"})
        assert bad.value.status == 422 and "image" in bad.value.reason
        with pytest.raises(TaskApiError) as missing:
            client.get("no-such-task")
        assert missing.value.status == 404
    with OrchestratorClient(orch.url, token="x" * 32) as wrong, pytest.raises(TaskApiError) as denied:
        wrong.list()
    assert denied.value.status == 403 and "wrong admin token" in denied.value.reason
    with OrchestratorClient(orch.url) as anonymous, pytest.raises(TaskApiError) as anon:
        anonymous.list()
    assert anon.value.status == 401


def test_signed_requests_by_the_manager_or_an_allowed_trainer(orch: Orchestrator, devnet) -> None:  # noqa: ANN001
    with OrchestratorClient(orch.url, wallet=orch.trainer) as trainer:  # type: ignore[attr-defined]
        task = trainer.submit(SPEC)
        assert task.id in [t.id for t in trainer.list()]
    with OrchestratorClient(orch.url, wallet=devnet.manager) as manager:
        assert manager.get(task.id).id == task.id
        manager.delete(task.id)
    with OrchestratorClient(orch.url, wallet=Wallet.create()) as stranger, pytest.raises(TaskApiError) as no:
        stranger.list()
    assert no.value.status == 403 and "INTELLECT_ORCH_ADMIN_SIGNERS" in no.value.reason
    with pytest.raises(ValueError, match="either an admin token or a wallet"):
        OrchestratorClient(orch.url, token=orch.token, wallet=devnet.manager)


def test_retries_ride_out_an_orchestrator_restart(orch: Orchestrator) -> None:
    orch.stop()
    restarter = threading.Timer(1.0, orch.start)
    restarter.start()
    try:
        started = time.monotonic()
        with OrchestratorClient(orch.url, token=orch.token, retries=8) as client:
            assert isinstance(client.list(), list)  # refused at first, answered after the restart
        assert time.monotonic() - started >= 0.9
    finally:
        restarter.join()
    orch.stop()
    client = OrchestratorClient(orch.url, token=orch.token, retries=2)
    with client, pytest.raises(TaskApiError) as down:
        client.list()
    assert down.value.status == 0 and "cannot reach the orchestrator" in down.value.reason
    orch.start()


def test_the_task_cli(orch: Orchestrator, tmp_path: Path) -> None:
    runner = CliRunner()
    spec_file = tmp_path / "task.json"
    spec_file.write_text(json.dumps(SPEC))
    env = {"INTELLECT_ORCHESTRATOR_URL": orch.url, "INTELLECT_ADMIN_TOKEN": orch.token}

    def cli(*args: str, code: int = 0) -> str:
        """stdout on success (what scripts parse); everything printed when a failure is expected.
        The in-process orchestrator logs to the same stderr, so JSON is read from stdout only."""
        result = runner.invoke(intellect_app, ["task", *args], env=env)
        assert result.exit_code == code, result.output
        return result.stdout if code == 0 else result.output

    created = json.loads(cli("submit", str(spec_file), "--json"))
    listed = json.loads(cli("list", "--json"))
    assert created["id"] in [t["id"] for t in listed]
    assert "sdk-test" in cli("list")  # the table
    status = json.loads(cli("status", created["id"], "--json"))
    assert status["task"]["id"] == created["id"] and status["nodes"] == []
    out = cli("wait", created["id"], "--timeout", "0.5", code=1)
    assert "did not reach running" in out
    assert cli("logs", created["id"]) == ""
    assert json.loads(cli("delete", created["id"], "--json"))["deleted"] is True
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x"}')
    assert "image" in cli("submit", str(bad), code=1)
    assert "404" in cli("status", "nope", code=1)
    env["INTELLECT_ADMIN_TOKEN"] = "y" * 32
    assert "wrong admin token" in cli("list", code=1)
