"""The workload seam (`intellect.workloads`): plug-ins found through entry points, a third-party one
(tests/fixtures/plugins, written only against the public seam) treated exactly like the shipped
inference plug-in, and a task's workload settings checked and rendered when it is POSTed (422
naming the setting)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from intellect import workloads
from intellect.wire.tasks import TaskSpec
from intellect.workloads import UnknownWorkload, WorkloadSettingsError, load
from orchestrator.api.deps import get_settings, get_task_store, require_admin, require_reader
from orchestrator.api.routes import tasks
from orchestrator.db import make_engine, migrate, session_factory
from orchestrator.settings import OrchestratorSettings
from orchestrator.store.tasks import TaskStore
from workloads.inference.plugin import InferencePlugin

PLUGINS = Path(__file__).resolve().parents[1] / "fixtures" / "plugins"


@pytest.fixture
def third_party(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The wordcount package 'pip-installed' on the path: its dist-info names its entry points."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    yield
    workloads._loaded.clear()


def spec(workload: dict | None = None, **extra: object) -> TaskSpec:
    return TaskSpec.model_validate({"name": "t", **({"workload": workload} if workload else {}), **extra})


def test_the_inference_plugin_is_registered_by_entry_point() -> None:
    assert "inference" in workloads.installed()
    assert isinstance(load("inference"), InferencePlugin)


def test_a_third_party_plugin_loads_like_the_shipped_one(third_party: None) -> None:
    found = workloads.installed()
    assert {"inference", "wordcount"} <= set(found)
    plugin = load("wordcount")
    assert plugin.name == "wordcount" and isinstance(plugin, workloads.Workload)
    with pytest.raises(UnknownWorkload, match="does not implement"):
        load("broken")
    with pytest.raises(UnknownWorkload, match=r"no workload plug-in 'nope'.*inference"):
        load("nope")


def test_without_the_package_its_workload_is_unknown() -> None:
    with pytest.raises(UnknownWorkload, match="wordcount"):
        load("wordcount")


def test_image_may_come_from_the_plugin_but_a_plain_task_needs_one() -> None:
    assert spec({"type": "inference"}).image == ""
    with pytest.raises(ValueError, match="image"):
        spec()
    with pytest.raises(ValueError, match="type"):
        spec({"type": "Bad Name!"})


@pytest.mark.parametrize(
    ("settings", "env", "field", "why"),
    [
        ({"batch_size": 0}, {}, "workload.settings.batch_size", "greater than or equal to 1"),
        ({"bogus": 1}, {}, "workload.settings.bogus", "not an inference workload setting"),
        ({}, {"INTELLECT_INFER_BATCHSIZE": "2"}, "env_vars.INTELLECT_INFER_BATCHSIZE", "not an inference"),
        ({"batch_size": 4}, {"INTELLECT_INFER_BATCH_SIZE": "2"}, "workload.settings.batch_size", "disagrees"),
        ({"max_new_tokens": 1024}, {}, "workload.settings.max_new_tokens", "512 positions"),
        ({"node_address": "0x01"}, {}, "workload.settings.node_address", "set by the worker"),
        ({"dataset": "revers"}, {}, "workload.settings.dataset", "neither a shipped set"),
        ({"target_lengths": [64]}, {}, "workload.settings.target_lengths", "can never be met"),
        ({"poll_seconds": "soon"}, {}, "workload.settings.poll_seconds", "valid number"),
    ],
)
def test_inference_settings_refused_naming_the_setting(
    settings: dict, env: dict, field: str, why: str
) -> None:
    with pytest.raises(WorkloadSettingsError) as caught:
        InferencePlugin().task_settings(spec({"type": "inference", "settings": settings}, env_vars=env))
    assert caught.value.field == field and why in caught.value.reason


def test_inference_settings_from_both_places_and_rendered_for_the_program() -> None:
    s = spec(
        {"type": "inference", "settings": {"dataset": "reverse", "batch_size": 2, "target_lengths": [4, 8]}},
        env_vars={"INTELLECT_INFER_N": "3", "INTELLECT_INFER_NODE_ADDRESS": "${NODE_ADDRESS}"},
    )
    plugin = InferencePlugin()
    judged = plugin.task_settings(s)
    assert (judged.dataset, judged.batch_size, judged.n, judged.target_lengths) == ("reverse", 2, 3, [4, 8])
    rendered = plugin.render(s, judged)
    assert rendered.image == "intellect-workload:latest"
    assert rendered.entrypoint == ["python3", "-m", "workloads.inference"]
    assert rendered.env_vars["INTELLECT_INFER_BATCH_SIZE"] == "2"
    assert rendered.env_vars["INTELLECT_INFER_TARGET_LENGTHS"] == "[4, 8]"
    # the rendered spec reads back to the same judged settings (what a validator will see)
    assert plugin.task_settings(rendered) == judged


def test_a_task_names_its_generating_backend() -> None:
    """Issue 57: `backend` is a judged setting (validators pick the calibration record's part for it),
    rendered for the program, and a vLLM task without an image of its own runs in the vLLM image."""
    plugin = InferencePlugin()
    s = spec({"type": "inference", "settings": {"backend": "vllm"}})
    judged = plugin.task_settings(s)
    assert judged.backend == "vllm" and plugin.task_settings(spec({"type": "inference"})).backend == "torch"
    rendered = plugin.render(s, judged)
    assert rendered.image == "intellect-workload-vllm:latest"
    assert rendered.env_vars["INTELLECT_INFER_BACKEND"] == "vllm"
    assert plugin.task_settings(rendered) == judged
    with pytest.raises(WorkloadSettingsError) as caught:
        plugin.task_settings(spec({"type": "inference", "settings": {"backend": "sglang"}}))
    assert caught.value.field == "workload.settings.backend"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    engine = make_engine(f"sqlite:///{tmp_path / 'tasks.db'}")
    migrate(engine)

    async def nothing() -> None:
        return None

    store = TaskStore(session_factory(engine), on_change=nothing)
    app = FastAPI()
    app.include_router(tasks.router)
    app.dependency_overrides[get_task_store] = lambda: store
    app.dependency_overrides[get_settings] = lambda: OrchestratorSettings(state_dir=tmp_path)
    app.dependency_overrides[require_admin] = lambda: "admin"
    app.dependency_overrides[require_reader] = lambda: "admin"
    with TestClient(app) as test_client:
        yield test_client
    engine.dispose()


def test_post_renders_the_task_and_refuses_bad_settings_with_422(
    client: TestClient, third_party: None
) -> None:
    ok = client.post("/tasks", json={"name": "r", "workload": {"type": "inference", "settings": {"n": 2}}})
    assert ok.status_code == 201, ok.text
    stored = ok.json()["spec"]
    assert stored["image"] == "intellect-workload:latest" and stored["env_vars"]["INTELLECT_INFER_N"] == "2"
    assert stored["workload"] == {"type": "inference", "settings": {"n": 2}}
    wordcount = {"type": "wordcount", "settings": {"words": 3}}
    words = client.post("/tasks", json={"name": "w", "workload": wordcount})
    assert words.status_code == 201, words.text
    assert words.json()["spec"]["cmd"][:2] == ["python3", "-c"]
    for body, detail in (
        ({"type": "nope"}, "workload.type: no workload plug-in 'nope'"),
        ({"type": "inference", "settings": {"max_new_tokens": 4096}}, "workload.settings.max_new_tokens"),
        ({"type": "wordcount", "settings": {"words": 0}}, "workload.settings.words"),
        ({"type": "broken"}, "does not implement"),
    ):
        bad = client.post("/tasks", json={"name": "x", "workload": body})
        assert bad.status_code == 422 and detail in bad.json()["detail"], bad.text
    assert [t["spec"]["name"] for t in client.get("/tasks").json()] == ["r", "w"]
