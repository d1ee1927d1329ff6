"""One validator, files of several tasks at once: each file is judged by the task it was uploaded for,
with that task's workload plug-in, never by the validator's own defaults.

Real anvil, a real orchestrator (storage, task records, the validator role checked on chain), the
real validator service built as `intellect-validator run` builds it (`build_judge`). Queued together:
two honest inference tasks with different datasets and batch shapes (both accepted: before the seam,
the validator judged every file by its built-in defaults, dataset `demo` 8×4, and invalidated both),
a node that deviates from its task's batch shape (still caught), a third-party plug-in's task
(tests/fixtures/plugins; honest file accepted, a forged one invalidated), a task posted in the raw
inference form (no workload named: the inference plug-in claims its program, the stored task names
it, its honest file is accepted as before the seam) and a file whose task no plug-in claims
(accepted as *unjudged*, saying so in the POST's answer; its file soft-invalidated: it cannot be
pinned on the node), and a task on a model wider than the tiny one (the `small` shape, issue 54): its
honest file accepted and an int8 node's slashed, both judged under the record `small` (`/verdicts`
names it), where the plug-in once applied the tiny model's limits."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "uploads"))
PLUGINS = Path(__file__).resolve().parents[1] / "fixtures" / "plugins"

from uploads_world import Heartbeats, Orchestrator, make_healthy, wait_for  # noqa: E402

from intellect import workloads  # noqa: E402
from intellect.identity import Wallet  # noqa: E402
from intellect.wire.storage import UploadRequest  # noqa: E402
from ledger.models import WorkStatus  # noqa: E402
from tests.support.testing import ServerThread  # noqa: E402
from validator.api import create_app  # noqa: E402
from validator.cli import build_judge  # noqa: E402
from validator.service import ValidatorService  # noqa: E402
from validator.settings import ValidatorSettings  # noqa: E402
from workloads.inference.judge.calibrate import Grid, cheat_workload  # noqa: E402
from workloads.inference.settings import InferenceSettings  # noqa: E402
from workloads.inference.workload import InferenceWorkload  # noqa: E402
from workloads.model.shapes import build_model_dir  # noqa: E402
from workloads.rollouts import read_rollouts  # noqa: E402

REVERSE = {"dataset": "reverse", "batch_size": 2, "n": 2, "max_new_tokens": 12, "target_lengths": [6]}
WIDER = {"batch_size": 4, "n": 4, "max_new_tokens": 32}  # `small` shape (hidden 512, 8 layers); 16 chunks
DEMO = {"dataset": "demo", "batch_size": 3, "n": 3, "max_new_tokens": 16}


def rollout_file(node: Wallet, out: Path, settings: dict, task_id: str) -> tuple[Path, int]:
    """One batch as the worker would run it for `task_id` (its INTELLECT_TASK_ID salts the plan)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("INTELLECT_TASK_ID", task_id)
        workload = InferenceWorkload(InferenceSettings(node_address=node.address, output_dir=out, **settings))
    report = workload.run_batch()
    assert report is not None
    rows, _ = read_rollouts(report.path)
    return Path(report.path), sum(len(r.output_tokens) for r in rows)


def wider_file(node: Wallet, out: Path, model: Path, task_id: str, cheat: str | None) -> tuple[Path, int]:
    """A batch of the `small` shape, honest or one of its record's cheats made as `calibrate` made it."""
    grid = Grid(max_new_tokens=WIDER["max_new_tokens"], completions=WIDER["n"])
    with pytest.MonkeyPatch.context() as env:
        env.setenv("INTELLECT_TASK_ID", task_id)
        if cheat is None:
            settings = InferenceSettings(node_address=node.address, output_dir=out, model=str(model), **WIDER)
            workload = InferenceWorkload(settings)
        else:
            workload = cheat_workload(str(model), cheat, out, WIDER["batch_size"], grid, node.address)
    report = workload.run_batch()
    assert report is not None
    rows, _ = read_rollouts(report.path)
    return Path(report.path), sum(len(r.output_tokens) for r in rows)


def upload_and_submit(devnet, orch: Orchestrator, provider: Wallet, node: Wallet, task_id: str,  # noqa: ANN001
                      path: Path, units: int) -> str:
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    request = UploadRequest(task_id=task_id, original_name=path.name, size_bytes=len(data), sha256=sha,
                            work_units=units)  # fmt: skip
    grant = wait_for(lambda: (g := orch.request_upload(node, request)).status_code == 200 and g, 20,
                     f"an upload grant for task {task_id}")  # fmt: skip
    body = grant.json()
    put = httpx.put(body["url"], content=data, headers=body.get("headers") or {})
    assert put.status_code == 201, put.text
    devnet.client(provider).submit_work(devnet.pool_id, node.address, "0x" + sha, units)
    return "0x" + sha


def verdicts(api: ServerThread) -> dict[str, dict]:
    items = httpx.get(api.url + "/verdicts", params={"limit": 1000}).json()["items"]
    return {v["work_key"]: v for v in items}


def test_each_file_is_judged_by_its_own_task(devnet, redis_url, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.syspath_prepend(str(PLUGINS))  # the third-party plug-in, 'pip-installed' in this process
    workloads._loaded.clear()
    orch = Orchestrator(devnet, redis_url, tmp_path / "orch", upload_max_bytes=4 * 1024 * 1024).start()
    provider = devnet.new_provider()
    honest_a, honest_b, deviant, forger = (devnet.new_node(provider) for _ in range(4))
    for node in (honest_a, honest_b, deviant, forger):
        devnet.join(provider, node)
    nodes = [honest_a, honest_b, deviant, forger]
    make_healthy(orch, nodes)
    beats = Heartbeats(orch, nodes).start()
    key = devnet.spare_keys.pop(0)
    devnet.client(devnet.owner).grant_validator(Wallet.from_key(key).address)
    settings = ValidatorSettings(
        rpc_url=devnet.rpc_url, deployment=devnet.deployment.save(tmp_path / "deployment.json"),
        pool_ids=[devnet.pool_id], data_dir=tmp_path / "validator", orchestrator_url=orch.url,
        poll_seconds=0.2,
    )  # fmt: skip
    service = api = None
    try:
        keys: dict[str, str] = {}
        # task 1: string reversal, 2×2 rows of at most 12 tokens
        inference = {"type": "inference", "settings": REVERSE}
        named = orch.admin("POST", "/tasks", json={"name": "reverse", "workload": inference}).json()
        assert named["judged"] and named["warnings"] == []
        reverse = named["id"]
        path, units = rollout_file(honest_a, tmp_path / "a", REVERSE, reverse)
        keys["honest reverse"] = upload_and_submit(devnet, orch, provider, honest_a, reverse, path, units)
        # the deviant runs task 1 with another batch shape than the task's
        path, units = rollout_file(deviant, tmp_path / "d", {**REVERSE, "batch_size": 3}, reverse)
        keys["deviant"] = upload_and_submit(devnet, orch, provider, deviant, reverse, path, units)
        # task 2: the demo set, 3×3 rows of at most 16 tokens (now every node's current task)
        demo = orch.create_task({"name": "demo", "workload": {"type": "inference", "settings": DEMO}})
        path, units = rollout_file(honest_b, tmp_path / "b", DEMO, demo)
        keys["honest demo"] = upload_and_submit(devnet, orch, provider, honest_b, demo, path, units)
        # task 3: a third-party workload; one honest file, one whose words are not the task's
        wordcount = {"type": "wordcount", "settings": {"words": 7}}
        words = orch.create_task({"name": "words", "workload": wordcount})
        assert orch.admin("GET", f"/tasks/{words}").json()["spec"]["cmd"][:2] == ["python3", "-c"]
        good, bad = tmp_path / "good.json", tmp_path / "bad.json"
        good.write_text('["hello", "hello", "hello", "hello", "hello", "hello", "hello"]')
        bad.write_text('["hello", "hello", "hello", "hello", "hello", "hello", "hello", "hello", "hello"]')
        keys["honest words"] = upload_and_submit(devnet, orch, provider, honest_b, words, good, 7)
        keys["forged words"] = upload_and_submit(devnet, orch, provider, forger, words, bad, 9)
        # task 4: the raw inference form (before the seam): the inference plug-in claims it
        raw_settings = {**REVERSE, "target_lengths": "[6]"}
        env = {f"INTELLECT_INFER_{k.upper()}": str(v) for k, v in raw_settings.items()}
        raw = orch.admin("POST", "/tasks", json={"name": "raw", "image": "intellect-workload:latest",
                                                 "entrypoint": ["python3", "-m", "workloads.inference"],
                                                 "env_vars": env}).json()  # fmt: skip
        assert raw["judged"] and raw["spec"]["workload"]["type"] == "inference" and raw["warnings"] == []
        assert raw["spec"]["entrypoint"] == ["python3", "-m", "workloads.inference"]  # its program kept
        path, units = rollout_file(honest_a, tmp_path / "raw", REVERSE, raw["id"])
        keys["raw form"] = upload_and_submit(devnet, orch, provider, honest_a, raw["id"], path, units)
        # task 5: a plain container task that names no workload: nothing to judge its files by, and the
        # POST says so, naming the installed workloads
        unjudged = orch.admin("POST", "/tasks", json={"name": "plain", "image": "intellect-test:latest",
                                                      "cmd": ["true"]})  # fmt: skip
        assert unjudged.status_code == 201 and not unjudged.json()["judged"]
        warning = " ".join(unjudged.json()["warnings"])
        assert "unjudged: its files are not judged or paid" in warning
        assert all(name in warning for name in ("inference", "pipeline", "wordcount")), warning
        plain = unjudged.json()["id"]
        assert not orch.admin("GET", f"/tasks/{plain}").json()["judged"]  # and so it reads later
        odd = tmp_path / "odd.bin"
        odd.write_bytes(b"not a rollout file")
        keys["no workload"] = upload_and_submit(devnet, orch, provider, honest_a, plain, odd, 1)

        # task 6: a model wider than the tiny one (issue 54): judged under its own calibration record
        small = build_model_dir("small", tmp_path / "models")
        wider = orch.create_task({"name": "wider", "workload": {
            "type": "inference", "settings": {**WIDER, "model": str(small)}}})  # fmt: skip
        path, units = wider_file(honest_b, tmp_path / "w", small, wider, None)
        keys["honest small shape"] = upload_and_submit(devnet, orch, provider, honest_b, wider, path, units)
        path, units = wider_file(deviant, tmp_path / "w8", small, wider, "int8 weights")
        keys["int8 small shape"] = upload_and_submit(devnet, orch, provider, deviant, wider, path, units)

        wallet = Wallet.from_key(key)
        service = ValidatorService(settings, wallet, build_judge(settings, wallet))
        service.start()
        api = ServerThread(create_app(service)).start()
        seen = wait_for(lambda: (v := verdicts(api)) and len(v) == len(keys) and v, 300, "every verdict")
        got = {name: seen[k]["verdict"] for name, k in keys.items()}
        assert got == {
            "honest reverse": "accept", "deviant": "invalidate", "honest demo": "accept",
            "honest words": "accept", "forged words": "invalidate", "no workload": "soft_invalidate",
            "raw form": "accept", "honest small shape": "accept", "int8 small shape": "invalidate",
        }, {name: seen[k]["reasons"] for name, k in keys.items()}  # fmt: skip
        for name in ("honest small shape", "int8 small shape"):  # /verdicts names the record that judged
            assert seen[keys[name]]["judged_by"]["record"] == "small", seen[keys[name]]
        assert seen[keys["honest demo"]]["judged_by"]["record"] == "tiny"
        assert any("the task's batch has 4" in r for r in seen[keys["deviant"]]["reasons"])  # 6 rows
        assert any("9 words, the task asks for 7" in r for r in seen[keys["forged words"]]["reasons"])
        assert "names no workload" in " ".join(seen[keys["no workload"]]["reasons"])
        assert "unjudged" in " ".join(seen[keys["no workload"]]["reasons"])
        # on chain: the two cheaters are slashed by the votes; the honest work stands
        client = devnet.client()
        status = lambda name: client.get_work(devnet.pool_id, keys[name]).status  # noqa: E731
        wait_for(lambda: status("forged words") == WorkStatus.INVALIDATED, 60, "the forged file invalidated")
        assert client.get_work(devnet.pool_id, keys["deviant"]).status == WorkStatus.INVALIDATED
        for name in ("honest reverse", "honest demo", "honest words", "raw form"):
            assert client.get_work(devnet.pool_id, keys[name]).status == WorkStatus.SUBMITTED, name
    finally:
        if api is not None:
            api.stop()
        if service is not None:
            service.stop()
        beats.stop()
        orch.stop()
        workloads._loaded.clear()


@pytest.mark.slow
def test_a_validator_without_the_role_cannot_read_tasks(devnet, redis_url, tmp_path) -> None:  # noqa: ANN001
    from intellect.signing import SignedAuth

    orch = Orchestrator(devnet, redis_url, tmp_path / "orch2").start()
    try:
        task = orch.create_task({"name": "r", "workload": {"type": "inference"}})
        stranger = Wallet.create()
        refused = httpx.get(f"{orch.url}/tasks/{task}", auth=SignedAuth(stranger), timeout=10)
        assert refused.status_code == 403 and "no validator role" in refused.json()["detail"]
        key = devnet.spare_keys.pop(0)
        devnet.client(devnet.owner).grant_validator(Wallet.from_key(key).address)
        read = httpx.get(f"{orch.url}/tasks/{task}", auth=SignedAuth(Wallet.from_key(key)), timeout=10)
        assert read.status_code == 200 and read.json()["spec"]["workload"]["type"] == "inference"
        # listing, creating and deleting tasks stay admin-only
        listed = httpx.get(f"{orch.url}/tasks", auth=SignedAuth(Wallet.from_key(key)), timeout=10)
        assert listed.status_code == 403
    finally:
        orch.stop()
