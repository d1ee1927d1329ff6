"""One router on a bare FastAPI app, its dependencies replaced through `app.dependency_overrides`.

This is what the `orchestrator.api` layout is for: the tasks router runs here against a real (migrated,
SQLite) `TaskStore`, with no Redis, chain, lifespan or background loop, and the admin check swapped for
a stub. Only the router's own behaviour is under test: status codes, bodies, and that each write tells
the replicas (the store's `on_change`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI, HTTPException, Request
from fastapi.testclient import TestClient

from intellect.auth import AdminToken
from orchestrator.access import AdminAccess
from orchestrator.api.deps import get_settings, get_task_store, require_admin, require_reader
from orchestrator.api.routes import tasks
from orchestrator.db import make_engine, migrate, session_factory
from orchestrator.settings import OrchestratorSettings
from orchestrator.store.tasks import TaskStore

SPEC = {"name": "rollouts", "image": "intellect/inference:dev", "cmd": ["run", "${TASK_ID}"]}


class Changes:
    """Stands in for the version bump + group keeper poke the server wires into the store."""

    def __init__(self) -> None:
        self.count = 0

    async def __call__(self) -> None:
        self.count += 1


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TaskStore]:
    engine = make_engine(f"sqlite:///{tmp_path / 'tasks.db'}")
    migrate(engine)
    yield TaskStore(session_factory(engine), on_change=Changes())
    engine.dispose()


def tasks_app(store: TaskStore, settings: OrchestratorSettings) -> FastAPI:
    app = FastAPI()
    app.include_router(tasks.router)
    app.dependency_overrides[get_task_store] = lambda: store
    app.dependency_overrides[get_settings] = lambda: settings
    return app


@pytest.fixture
def client(store: TaskStore, tmp_path: Path) -> Iterator[TestClient]:
    settings = OrchestratorSettings(state_dir=tmp_path, topology_names=["2x640GB"])
    app = tasks_app(store, settings)
    app.dependency_overrides[require_admin] = lambda: "admin"
    app.dependency_overrides[require_reader] = lambda: "admin"
    with TestClient(app) as test_client:
        yield test_client


def test_create_list_get_delete(client: TestClient, store: TaskStore) -> None:
    changes = store.on_change
    assert isinstance(changes, Changes)
    created = client.post("/tasks", json=SPEC)
    assert created.status_code == 201, created.text
    task = created.json()
    assert task["spec"]["name"] == "rollouts" and task["spec"]["cmd"] == ["run", "${TASK_ID}"]
    assert task["deleted"] is False
    assert changes.count == 1  # replicas are told about the new task
    listed = client.get("/tasks")
    assert listed.status_code == 200 and [t["id"] for t in listed.json()] == [task["id"]]
    assert client.get(f"/tasks/{task['id']}").json() == task | {"warnings": []}  # the POST's warning
    deleted = client.delete(f"/tasks/{task['id']}")
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert changes.count == 2
    assert client.get("/tasks").json() == []
    assert [t["id"] for t in client.get("/tasks", params={"include_deleted": True}).json()] == [task["id"]]
    # deletion is a mark: gone from GET as from the list, still readable with include_deleted, and
    # deleting it again answers the same record
    gone = client.get(f"/tasks/{task['id']}")
    assert gone.status_code == 404 and "was deleted" in gone.json()["detail"]
    kept = client.get(f"/tasks/{task['id']}", params={"include_deleted": True})
    assert kept.status_code == 200 and kept.json()["deleted"] is True
    again = client.delete(f"/tasks/{task['id']}")
    assert again.status_code == 200 and again.json()["deleted"] is True


def test_bad_spec_is_422_naming_the_field(client: TestClient, store: TaskStore) -> None:
    missing = client.post("/tasks", json={"name": "t"})
    assert missing.status_code == 422
    assert [e["loc"][-1] for e in missing.json()["detail"]] == ["image"]
    bad_env = client.post("/tasks", json=SPEC | {"env_vars": {"A=B": "x"}})
    assert bad_env.status_code == 422
    assert "env_vars" in bad_env.json()["detail"][0]["loc"] and "env var name" in bad_env.text
    # the one check made against the service's settings: topologies this orchestrator knows
    plugins = {"plugins": {"node_groups": {"allowed_topologies": ["no-such-topology"]}}}
    unknown = client.post("/tasks", json=SPEC | {"scheduling_config": plugins})
    assert unknown.status_code == 422
    assert unknown.json()["detail"].startswith("scheduling_config.plugins.node_groups.allowed_topologies:")
    assert "2x640GB" in unknown.json()["detail"]
    known = {"plugins": {"node_groups": {"allowed_topologies": ["2x640GB"]}}}
    assert client.post("/tasks", json=SPEC | {"scheduling_config": known}).status_code == 201
    assert len(client.get("/tasks").json()) == 1  # nothing was stored for the refused ones


def test_a_task_is_judged_by_the_workload_it_names_or_whose_program_it_runs_or_says_it_is_not(
    client: TestClient, store: TaskStore, tmp_path: Path
) -> None:
    named = client.post("/tasks", json={"name": "n", "workload": {"type": "inference"}}).json()
    assert named["judged"] and named["warnings"] == []
    assert named["spec"]["image"] == "intellect-workload:latest"
    raw = client.post("/tasks", json={"name": "r", "image": "intellect-workload:latest",
                                      "entrypoint": ["python3", "-m", "workloads.inference"],
                                      "env_vars": {"INTELLECT_INFER_BATCH_SIZE": "2"}}).json()  # fmt: skip
    assert raw["judged"] and raw["spec"]["workload"]["type"] == "inference" and raw["warnings"] == []
    assert raw["spec"]["env_vars"]["INTELLECT_INFER_BATCH_SIZE"] == "2"
    infer = ["python3", "-m", "workloads.inference"]
    bad_raw = client.post("/tasks", json={"name": "r", "image": "x", "cmd": infer,
                                          "env_vars": {"INTELLECT_INFER_BATCH_SIZE": "zero"}})  # fmt: skip
    assert bad_raw.status_code == 422 and "batch_size" in bad_raw.text  # claimed, so its settings are checked
    groups = {"plugins": {"node_groups": {"allowed_topologies": ["2x640GB"]}}}
    program = ["python3", "-m", "workloads.pipeline", "task"]
    member = client.post("/tasks", json={"name": "m", "image": "x", "scheduling_config": groups,
                                         "cmd": program}).json()  # fmt: skip
    assert member["spec"]["workload"]["type"] == "pipeline"
    plain = client.post("/tasks", json=SPEC).json()
    assert not plain["judged"] and "unjudged: its files are not judged or paid" in plain["warnings"][0]
    assert "installed workloads: arith, inference, pipeline" in plain["warnings"][0]  # arith: examples/
    assert [t["judged"] for t in client.get("/tasks").json()] == [True, True, True, False]
    strict = tasks_app(store, OrchestratorSettings(state_dir=tmp_path, refuse_unjudged=True))
    strict.dependency_overrides[require_admin] = lambda: "admin"
    with TestClient(strict) as pool:
        refused = pool.post("/tasks", json=SPEC)
        assert refused.status_code == 422 and "refuses unjudged tasks" in refused.json()["detail"]
        assert "installed workloads: arith, inference, pipeline" in refused.json()["detail"]
        assert pool.post("/tasks", json=raw["spec"] | {"name": "again"}).status_code == 201  # judged: taken
    assert len(client.get("/tasks").json()) == 5


def test_unknown_id_is_404(client: TestClient, store: TaskStore) -> None:
    for method in ("GET", "DELETE"):
        r = client.request(method, "/tasks/no-such-id")
        assert r.status_code == 404 and r.json() == {"detail": "no task no-such-id"}
    changes = store.on_change
    assert isinstance(changes, Changes) and changes.count == 0  # a failed delete changes nothing


def test_admin_dependency_guards_every_route(store: TaskStore, tmp_path: Path) -> None:
    """Without the override the router's own admin check runs: here a stub refusing everyone, and the
    real `AdminAccess` (bearer token) read from `app.state.admin` like in the full service."""
    app = tasks_app(store, OrchestratorSettings(state_dir=tmp_path))

    def refuse(request: Request) -> str:
        raise HTTPException(403, "not today")

    app.dependency_overrides[require_admin] = refuse
    app.dependency_overrides[require_reader] = refuse  # reading one task: admin or a validator
    with TestClient(app) as client:
        routes = (("GET", "/tasks"), ("POST", "/tasks"), ("GET", "/tasks/x"), ("DELETE", "/tasks/x"))
        for method, path in routes:
            r = client.request(method, path, json=SPEC if method == "POST" else None)
            assert (r.status_code, r.json()) == (403, {"detail": "not today"}), (method, path)
    del app.dependency_overrides[require_admin]
    del app.dependency_overrides[require_reader]
    token = "t" * 32
    app.state.admin = AdminAccess(AdminToken(token), [])
    with TestClient(app) as client:
        assert client.get("/tasks").status_code == 401
        assert client.get("/tasks", headers={"Authorization": "Bearer wrong-token"}).status_code == 403
        assert client.get("/tasks", headers={"Authorization": f"Bearer {token}"}).json() == []
