"""The validator service end to end on a real chain, a real orchestrator with its storage and real
HTTP: honest files accepted and served to the trainer's feed, a cheater's file invalidated on chain
(stake slashed, node ejected), a withheld file (on chain, never uploaded) invalidated and slashed, a
restart that loses and repeats nothing, and a reorg that rewinds the cursor by block hash."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "uploads"))

from typer.testing import CliRunner  # noqa: E402
from uploads_world import Heartbeats, Orchestrator, make_healthy, wait_for  # noqa: E402

from intellect.identity import Wallet  # noqa: E402
from intellect.wire.storage import UploadRequest  # noqa: E402
from ledger.audit import Auditor  # noqa: E402
from ledger.models import WorkStatus  # noqa: E402
from tests.support.testing import ServerThread  # noqa: E402
from validator.api import create_app  # noqa: E402
from validator.service import ValidatorService  # noqa: E402
from validator.settings import ValidatorSettings  # noqa: E402
from validator.store import SqlNodeWindows, SubmissionRow  # noqa: E402
from validator.watcher import Watcher  # noqa: E402
from worker.cli import app as worker_app  # noqa: E402
from worker.state import StateStore  # noqa: E402
from workloads.datasets import load_dataset  # noqa: E402
from workloads.inference.generate import group_advantages  # noqa: E402
from workloads.inference.judge.file_judge import InferenceJudge  # noqa: E402
from workloads.inference.settings import InferenceSettings  # noqa: E402
from workloads.inference.task import TaskSettings  # noqa: E402
from workloads.inference.workload import InferenceWorkload  # noqa: E402
from workloads.model.loading import (
    ModelCheckpoints,  # noqa: E402
    load_tokenizer,  # noqa: E402
)
from workloads.rollouts import read_rollouts, write_rollouts  # noqa: E402
from workloads.trainer.sources import AcceptedFeedSource  # noqa: E402
from workloads.verifiers import score  # noqa: E402

TASK = TaskSettings(batch_size=2, n=4, max_new_tokens=16)


class Node:
    def __init__(self, devnet, provider: Wallet, out: Path, cheat: str = "none") -> None:  # noqa: ANN001
        self.provider = provider
        self.wallet = devnet.new_node(provider)
        devnet.join(provider, self.wallet)
        self.workload = InferenceWorkload(
            InferenceSettings(node_address=self.wallet.address, output_dir=out, batch_size=TASK.batch_size,
                              n=TASK.n, max_new_tokens=TASK.max_new_tokens, cheat=cheat)
        )  # fmt: skip

    def batch(self) -> Path:
        report = self.workload.run_batch()
        assert report is not None
        return Path(report.path)


def json_document(text: str) -> Any:
    """The JSON document a CLI printed (in one write), from an output that may also hold log lines:
    CliRunner swaps this process's stdout, and the services running in its threads log there too
    (seen in CI: a warning line before the document)."""
    start = next(i for i, line in enumerate(text.splitlines(keepends=True)) if line[:1] in "{[")
    offset = sum(len(line) for line in text.splitlines(keepends=True)[:start])
    return json.JSONDecoder().raw_decode(text, offset)[0]


def forge_rewards(path: Path) -> Path:
    rows, info = read_rollouts(path)
    rows = [r.model_copy(update={"task_rewards": 1.0}) for r in rows]
    rewards = np.array([r.task_rewards - r.length_penalties for r in rows])
    adv = np.concatenate([group_advantages(rewards[g : g + TASK.n]) for g in range(0, len(rows), TASK.n)])
    rows = [r.model_copy(update={"rewards": float(w), "advantages": float(a)})
            for r, w, a in zip(rows, rewards, adv, strict=True)]  # fmt: skip
    forged = path.with_name("forged-" + path.name)
    write_rollouts(forged, rows, info)
    return forged


def forged_batch(node: Node) -> Path:
    """A batch of `node` with its rewards forged, from the first batch where that is a lie."""
    while lies(forged := forge_rewards(node.batch())) == 0:
        pass
    return forged


def submit(devnet, orch: Orchestrator, node: Node, task_id: str, path: Path, upload: bool = True) -> str:  # noqa: ANN001
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    rows, _ = read_rollouts(path)
    units = sum(len(r.output_tokens) for r in rows)
    if upload:
        request = UploadRequest(
            task_id=task_id, original_name=path.name, size_bytes=len(data), sha256=sha, work_units=units
        )
        grant = orch.request_upload(node.wallet, request)
        assert grant.status_code == 200, grant.text
        body = grant.json()
        put = httpx.put(body["url"], content=data, headers=body.get("headers") or {})
        assert put.status_code == 201, put.text
    devnet.client(node.provider).submit_work(devnet.pool_id, node.wallet.address, "0x" + sha, units)
    return "0x" + sha


@pytest.fixture(scope="module")
def world(devnet, redis_url, tmp_path_factory):  # noqa: ANN001
    root = tmp_path_factory.mktemp("validator-service")
    orch = Orchestrator(devnet, redis_url, root / "orch", upload_max_bytes=4 * 1024 * 1024).start()
    honest = Node(devnet, devnet.new_provider(), root / "honest")
    cheater = Node(devnet, devnet.new_provider(), root / "cheater")
    make_healthy(orch, [honest.wallet, cheater.wallet])
    beats = Heartbeats(orch, [honest.wallet, cheater.wallet]).start()
    task_id = orch.create_task({"name": "rollouts", "image": "intellect-workload:latest"})
    key = devnet.spare_keys.pop(0)
    devnet.client(devnet.owner).grant_validator(Wallet.from_key(key).address)
    deployment = devnet.deployment.save(root / "deployment.json")
    settings = ValidatorSettings(
        rpc_url=devnet.rpc_url, deployment=deployment, pool_ids=[devnet.pool_id], data_dir=root / "validator",
        orchestrator_url=orch.url, poll_seconds=0.2, fetch_window_seconds=3.0,
    )  # fmt: skip
    world = {"orch": orch, "honest": honest, "cheater": cheater, "task": task_id, "settings": settings,
             "wallet": Wallet.from_key(key), "root": root, "beats": beats}  # fmt: skip
    yield world
    beats.stop()
    orch.stop()


def start_service(world) -> tuple[ValidatorService, ServerThread]:  # noqa: ANN001
    factory = lambda seen: InferenceJudge(TASK, seen, ModelCheckpoints(TASK.model), windows=SqlNodeWindows(seen.db))  # noqa: E731, E501
    service = ValidatorService(world["settings"], world["wallet"], factory).start()
    return service, ServerThread(create_app(service)).start()


def verdict_of(api: ServerThread, work_key: str) -> dict | None:
    items = httpx.get(api.url + "/verdicts", params={"limit": 1000}).json()["items"]
    mine = [v for v in items if v["work_key"] == work_key]
    assert len(mine) <= 1, f"{work_key} judged {len(mine)} times"
    return mine[0] if mine else None


def test_honest_accepted_cheater_slashed_withheld_invalidated(devnet, world) -> None:  # noqa: ANN001
    orch, honest, cheater, task = world["orch"], world["honest"], world["cheater"], world["task"]
    client = devnet.client()
    stake_before = client.get_provider(cheater.provider.address).stake
    withholder = Node(devnet, devnet.new_provider(), world["root"] / "withholder")
    world["beats"].add(withholder.wallet)
    make_healthy(orch, [withholder.wallet])
    service, api = start_service(world)
    try:
        good = submit(devnet, orch, honest, task, honest.batch())
        bad = submit(devnet, orch, cheater, task, forged_batch(cheater))
        # work recorded on chain whose file never reaches storage: withheld, so invalidated and slashed
        lost = submit(devnet, orch, withholder, task, withholder.batch(), upload=False)

        v_good = wait_for(lambda: verdict_of(api, good), 120, "honest verdict")
        assert v_good["verdict"] == "accept", v_good
        v_bad = wait_for(lambda: (v := verdict_of(api, bad)) and v["tx_hash"] and v, 120, "cheater vote")
        assert v_bad["verdict"] == "invalidate" and "verifier does not give" in " ".join(v_bad["reasons"])
        v_lost = wait_for(lambda: (v := verdict_of(api, lost)) and v["tx_hash"] and v, 120, "withheld")
        assert v_lost["verdict"] == "invalidate" and v_lost["reasons"][0].startswith("data availability:")

        # on chain: the cheater is slashed and ejected, the honest work stands, the lost one is soft
        assert client.get_work(devnet.pool_id, bad).status == WorkStatus.INVALIDATED
        assert client.get_provider(cheater.provider.address).stake < stake_before
        assert not client.is_node_in_pool(devnet.pool_id, cheater.wallet.address)
        assert client.get_work(devnet.pool_id, good).status == WorkStatus.SUBMITTED
        assert client.get_work(devnet.pool_id, lost).status == WorkStatus.INVALIDATED
        assert not client.is_node_in_pool(devnet.pool_id, withholder.wallet.address)
        assert client.claimable_rewards(withholder.wallet.address) == 0
        # the pool owner's audit of the cheater's file: invalidated, by which transaction, and why
        _, entry = Auditor(client, [api.url]).work_key(bad)
        assert entry.status == "invalidated" and entry.invalidated_tx == v_bad["tx_hash"]
        assert entry.votes and all("verifier does not give" in " ".join(v.reasons) for v in entry.votes)
        assert client.pending_rewards(withholder.wallet.address) == 0
        assert client.is_node_in_pool(devnet.pool_id, honest.wallet.address)

        # the trainer's feed: only the accepted file, whose URL serves its exact bytes
        feed = httpx.get(api.url + "/accepted", params={"pool": devnet.pool_id}).json()
        assert [i["work_key"] for i in feed["items"]] == [good]
        item = feed["items"][0]
        body = httpx.get(item["url"]).content
        assert hashlib.sha256(body).hexdigest() == item["sha256"] == good[2:]
        assert item["rows"] == TASK.batch_size * TASK.n and item["step"] == 0
        assert httpx.get(api.url + "/accepted", params={"after": feed["next"]}).json()["items"] == []
        metrics = httpx.get(api.url + "/metrics").text
        assert 'validator_files_total{verdict="accept"}' in metrics and "validator_check_seconds" in metrics
        assert httpx.get(api.url + f"/files/{bad[2:]}").status_code == 404
        # the trainer's reader of that feed downloads exactly the accepted file, once
        source = AcceptedFeedSource(api.url, world["root"] / "trainer-in", pool_id=devnet.pool_id)
        [got] = source.new_files(set())
        assert got.file_id == good[2:] and hashlib.sha256(got.path.read_bytes()).hexdigest() == good[2:]
        assert source.new_files({got.file_id}) == []
        # the cheater's own worker CLI shows the verdict on its work, with the reason
        state_dir = world["root"] / "cheater-state"
        StateStore(state_dir / "state.json").update(node_address=cheater.wallet.address)
        result = CliRunner().invoke(
            worker_app,
            [
                "status",
                "--state-dir",
                str(state_dir),
                "--rpc-url",
                devnet.rpc_url,
                "--pool-id",
                str(devnet.pool_id),
                "--validator-url",
                api.url,
                "--json",
            ],
        )
        assert result.exit_code == 0, result.output
        mine = json_document(result.stdout)["verdicts"][api.url]
        assert mine["counts"] == {"invalidate": 1}
        assert "verifier does not give" in " ".join(mine["rejected"][0]["reasons"])
    finally:
        api.stop()
        service.stop()


def test_a_ground_batch_is_not_paid_on_chain_and_its_node_is_not_slashed(devnet, world) -> None:  # noqa: ANN001
    """Issue 18.5 on the real chain: a node makes batches 1..4 and records only its best, batch 3, then
    batch 4. Batch 3 is soft-invalidated on chain (its reward dropped, no slash: an honest worker can
    leave a gap), and so is batch 4, held after the gap (issue 37.5: a withheld batch costs the next
    ones too); the node keeps its stake and its place."""
    orch, task = world["orch"], world["task"]
    grinder = Node(devnet, devnet.new_provider(), world["root"] / "grinder")
    world["beats"].add(grinder.wallet)
    make_healthy(orch, [grinder.wallet])
    client = devnet.client()
    stake = client.get_provider(grinder.provider.address).stake
    made = [grinder.batch() for _ in range(4)]
    service, api = start_service(world)
    try:
        ground = submit(devnet, orch, grinder, task, made[2])
        after = submit(devnet, orch, grinder, task, made[3])
        v_ground = wait_for(lambda: verdict_of(api, ground), 120, "the ground batch's verdict")
        assert v_ground["verdict"] == "soft_invalidate", v_ground
        assert "selection: batch counter 3 where 1 was due" in " ".join(v_ground["reasons"])
        v_after = wait_for(lambda: verdict_of(api, after), 120, "the next batch's verdict")
        assert v_after["verdict"] == "soft_invalidate" and "is held" in v_after["reasons"][0], v_after
        for key in (ground, after):
            wait_for(lambda k=key: client.get_work(devnet.pool_id, k).status == WorkStatus.SOFT_INVALIDATED,
                     60, "the soft invalidations on chain")  # fmt: skip
        assert client.pending_rewards(grinder.wallet.address) == 0  # neither is paid
        assert client.get_provider(grinder.provider.address).stake == stake
        assert client.is_node_in_pool(devnet.pool_id, grinder.wallet.address)
    finally:
        api.stop()
        service.stop()


def test_cursors_and_pools_too_large_for_sql_are_a_422_not_a_500(world) -> None:  # noqa: ANN001
    """after or pool >= 2**63 raised OverflowError in the store: a 500 (267 of 21,319 fuzz cases)."""
    service, api = start_service(world)
    try:
        for route in ("/verdicts", "/accepted"):
            for params in ({"after": 2**63}, {"pool": 2**64}, {"after": 2**63 - 1}):
                r = httpx.get(api.url + route, params=params, timeout=10)
                want = 200 if params.get("after") == 2**63 - 1 else 422
                assert r.status_code == want, (route, params, r.text)
    finally:
        api.stop()
        service.stop()


@pytest.mark.slow
def test_the_validator_api_survives_the_fuzzer(world) -> None:  # noqa: ANN001
    """schemathesis over every operation of the validator's OpenAPI document (issue 19.7): no 5xx,
    every answer documented (with the verdicts the tests before it left, when run with them)."""
    from tests.support.openapi_fuzz import run_fuzz

    service, api = start_service(world)
    try:
        ran = run_fuzz(api.url)
        assert {"GET /verdicts", "GET /accepted", "GET /health"} <= set(ran), ran
    finally:
        api.stop()
        service.stop()


def test_restart_mid_stream_loses_and_repeats_nothing(devnet, world) -> None:  # noqa: ANN001
    orch, honest, task = world["orch"], world["honest"], world["task"]
    service, api = start_service(world)
    first = submit(devnet, orch, honest, task, honest.batch())
    wait_for(lambda: verdict_of(api, first), 60, "first verdict")
    api.stop()
    service.stop()
    # submitted while no validator runs
    while_down = [submit(devnet, orch, honest, task, honest.batch()) for _ in range(2)]
    service, api = start_service(world)
    try:
        for key in while_down:
            v = wait_for(lambda key=key: verdict_of(api, key), 60, "verdict after restart")
            assert v["verdict"] == "accept", v
        time.sleep(1.0)  # a few more passes: nothing is judged a second time
        items = httpx.get(api.url + "/verdicts", params={"limit": 1000}).json()["items"]
        keys = [i["work_key"] for i in items]
        assert len(keys) == len(set(keys))
        assert {first, *while_down} <= set(keys)
    finally:
        api.stop()
        service.stop()


def test_reorg_rewinds_by_block_hash(devnet, world, tmp_path) -> None:  # noqa: ANN001
    orch, honest, task = world["orch"], world["honest"], world["task"]
    settings = world["settings"].model_copy(update={"data_dir": tmp_path / "v"})
    factory = lambda seen: InferenceJudge(TASK, seen, ModelCheckpoints(TASK.model), windows=SqlNodeWindows(seen.db))  # noqa: E731, E501
    service = ValidatorService(settings, world["wallet"], factory)  # loops not started: driven by hand
    watcher: Watcher = service.watcher
    watcher.poll()  # everything submitted so far is queued (this validator is new)

    def queued() -> set[str]:  # pending, due now or held behind its node's earlier files
        with watcher.db.transaction() as s:
            rows = s.scalars(select(SubmissionRow.work_key).where(SubmissionRow.state == "pending"))
            return set(rows)

    earlier = queued()
    snapshot = devnet.anvil.rpc("evm_snapshot")
    doomed = submit(devnet, orch, honest, task, honest.batch())
    assert watcher.poll() == 1
    assert queued() == earlier | {doomed}
    devnet.anvil.rpc("evm_revert", [snapshot])  # the block with that submission is gone...
    for _ in range(3):
        devnet.anvil.rpc("evm_mine")  # ...and other blocks took its height
    watcher.poll()
    assert watcher.reorgs == 1
    assert queued() == earlier  # forgotten, not judged
    replacement = submit(devnet, orch, honest, task, honest.batch())
    assert watcher.poll() == 1
    assert queued() == earlier | {replacement}


def lies(path: Path) -> int:
    """Rows whose claimed task reward differs from what the task's verifier gives."""
    rows, _ = read_rollouts(path)
    records = {r.problem_id: r for r in load_dataset(TASK.dataset)}
    tok = load_tokenizer(TASK.model)
    truth = [score(records[r.problem_id], tok.decode(r.output_tokens, skip_special_tokens=True))
             for r in rows]  # fmt: skip
    return sum(abs(t - r.task_rewards) > 1e-6 for t, r in zip(truth, rows, strict=True))


def test_two_of_three_quorum_slashes_a_cheating_workload(devnet, world) -> None:  # noqa: ANN001
    """Last in this module: it gives the pool a 2-of-3 policy. Three validators are named; two run.
    The cheating worker's inference workload (`cheat="forged-reward"`) is slashed by their two votes."""
    orch, task, root = world["orch"], world["task"], world["root"]
    owner = devnet.client(devnet.owner)  # the pool's creator
    validators = [Wallet.from_key(devnet.spare_keys.pop(0)) for _ in range(3)]
    for v in validators:
        owner.grant_validator(v.address)  # the orchestrator serves files to validators on chain
        owner.slashing.add_validator(devnet.pool_id, v.address)
    amount = 50 * 10**18
    owner.slashing.set_policy(devnet.pool_id, 2, amount, 3600)
    cheater = Node(devnet, devnet.new_provider(), root / "cheat-workload", cheat="forged-reward")
    world["beats"].add(cheater.wallet)
    make_healthy(orch, [cheater.wallet])
    stake = devnet.client().get_provider(cheater.provider.address).stake
    factory = lambda seen: InferenceJudge(TASK, seen, ModelCheckpoints(TASK.model), windows=SqlNodeWindows(seen.db))  # noqa: E731, E501
    running = []
    for i, v in enumerate(validators[:2]):
        settings = world["settings"].model_copy(update={"data_dir": root / f"quorum-{i}"})
        running.append(ValidatorService(settings, v, factory).start())
    try:
        # A batch whose answers were all right anyway is not forged at all (claiming 1.0 is the truth);
        # with 8 rows that happens now and then, so take the first batch where the claim is a lie.
        forged = cheater.batch()
        while lies(forged) == 0:
            forged = cheater.batch()
        bad = submit(devnet, orch, cheater, task, forged)
        client = devnet.client()
        wait_for(lambda: client.get_work(devnet.pool_id, bad).status == WorkStatus.INVALIDATED, 90, "quorum")
        assert client.get_provider(cheater.provider.address).stake == stake - amount
        assert not client.is_node_in_pool(devnet.pool_id, cheater.wallet.address)
        assert client.slashing.votes(devnet.pool_id, bad, validators[0].address).votes == 2
        for service in running:
            rows = service.verdicts.page(pool_id=devnet.pool_id, node=None, after=0, limit=1000)
            mine = [r for r in rows if r.work_key == bad]
            assert len(mine) == 1 and mine[0].verdict == "invalidate"
            wait_for(lambda s=service: s.verdicts.votes_due() == [], 30, "votes sent")
    finally:
        for service in running:
            service.stop()
