"""Data availability when the pool's storage is down: a validator that cannot reach storage never
votes to invalidate (the node is not at fault), and soft-invalidates only when the voting deadline
comes near, so the work is not paid unjudged and nobody is slashed. (Withheld files, never uploaded,
are invalidated and slashed: tests/validator/test_service.py.)"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "uploads"))

from test_service import TASK, Node, submit  # noqa: E402
from uploads_world import Heartbeats, Orchestrator, make_healthy, wait_for  # noqa: E402

from intellect.identity import Wallet  # noqa: E402
from intellect.net import free_port  # noqa: E402
from ledger.models import WorkStatus  # noqa: E402
from validator.service import ValidatorService  # noqa: E402
from validator.settings import ValidatorSettings  # noqa: E402
from validator.store import SqlNodeWindows  # noqa: E402
from workloads.inference.judge.file_judge import InferenceJudge  # noqa: E402
from workloads.model.loading import ModelCheckpoints  # noqa: E402

WINDOW = 48  # the pool's voting window: available after 16 s, soft-invalidated after 18 s


def test_unreachable_storage_never_slashes_and_soft_invalidates_before_the_deadline(
    devnet, redis_url, tmp_path  # noqa: ANN001
) -> None:
    orch = Orchestrator(devnet, redis_url, tmp_path / "orch", upload_max_bytes=4 * 1024 * 1024).start()
    node = Node(devnet, devnet.new_provider(), tmp_path / "node")
    make_healthy(orch, [node.wallet])
    beats = Heartbeats(orch, [node.wallet]).start()
    validator = Wallet.from_key(devnet.spare_keys.pop(0))
    owner = devnet.client(devnet.owner)
    owner.grant_validator(validator.address)
    owner.slashing.add_validator(devnet.pool_id, validator.address)
    owner.slashing.set_policy(devnet.pool_id, 1, 50 * 10**18, WINDOW)
    settings = ValidatorSettings(
        rpc_url=devnet.rpc_url, deployment=devnet.deployment.save(tmp_path / "deployment.json"),
        pool_ids=[devnet.pool_id], data_dir=tmp_path / "validator", poll_seconds=0.2,
        orchestrator_url=f"http://127.0.0.1:{free_port()}",  # storage down: nothing listens there
    )  # fmt: skip
    task = orch.create_task({"name": "rollouts", "image": "intellect-workload:latest"})
    client = devnet.client()
    stake = client.get_provider(node.provider.address).stake
    factory = lambda seen: InferenceJudge(TASK, seen, ModelCheckpoints(TASK.model), windows=SqlNodeWindows(seen.db))  # noqa: E731, E501
    service = ValidatorService(settings, validator, factory).start()
    try:
        key = submit(devnet, orch, node, task, node.batch())  # uploaded; this validator cannot reach it
        submitted = time.time()
        judged = lambda: service.verdicts.page(pool_id=devnet.pool_id, node=None, after=0, limit=10)  # noqa: E731
        verdict = wait_for(judged, WINDOW, "a verdict before the deadline")
        assert time.time() - submitted > WINDOW / 3, "judged before the availability window passed"
        assert [v.verdict for v in verdict] == ["soft_invalidate"], [v.reasons for v in verdict]
        assert "storage unreachable" in verdict[0].reasons
        wait_for(lambda: client.get_work(devnet.pool_id, key).status == WorkStatus.SOFT_INVALIDATED,
                 WINDOW, "the soft invalidation on chain")  # fmt: skip
        assert client.get_provider(node.provider.address).stake == stake  # nobody slashed
        assert client.is_node_in_pool(devnet.pool_id, node.wallet.address)
        assert client.claimable_rewards(node.wallet.address) == 0  # and nothing paid unjudged
    finally:
        service.stop()
        beats.stop()
        orch.stop()
