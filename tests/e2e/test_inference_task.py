"""The inference workload as a real task: trainer POSTs it, a worker runs it, rollouts land on chain.

anvil + Redis + discovery + orchestrator + one `intellect-worker start --runtime process` (the
Docker test image carries no torch): the task runs `python -m workloads.inference` for one batch →
a parquet rollout file with TOPLOC proofs is announced on the bridge → uploaded through a signed
URL → `WorkSubmitted` with its sha256 and the output-token count as work units. The stored file is
then judged by the validator's pipeline (`intellect-validator check`): accepted.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_control_plane import wait_until  # noqa: E402
from test_task_execution import running_stack  # noqa: E402

from ledger.events import EventReader  # noqa: E402
from workloads.rollouts import read_rollouts  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MAX_NEW = 16


def inference_task() -> dict:
    return {
        "name": "rollouts-step-0",
        "image": "intellect-inference:latest",
        "entrypoint": [sys.executable, "-m", "workloads.inference"],
        "env_vars": {"PYTHONPATH": str(REPO), "INTELLECT_INFER_NODE_ADDRESS": "${NODE_ADDRESS}"},
        "workload": {
            "type": "inference",
            "settings": {"batch_size": 2, "n": 2, "max_new_tokens": MAX_NEW, "max_batches": 1, "step": 0},
        },
        "storage_config": {"file_name_template": "step-0/${NODE_ADDRESS}/${CURRENT_FILE_INDEX}.parquet"},
    }


def test_inference_rollouts_flow_from_task_to_chain(tmp_path: Path) -> None:
    with running_stack("process", tmp_path) as cluster:
        node = cluster.nodes[0]
        wait_until("the worker Healthy", lambda: cluster.state_of(0) == "Healthy", 90)
        created = cluster.orch("POST", "/tasks", json=inference_task())
        assert created.status_code == 201, created.text

        events, key = one_submission(cluster, node.address, 240)

        stored = cluster.orch("GET", f"/storage/files/{key}")
        assert stored.status_code == 200, stored.text
        info = stored.json()
        assert info["file_name"] == f"step-0/{node.address}/0.parquet"
        data = httpx.get(info["url"], timeout=30).content
        assert hashlib.sha256(data).hexdigest() == key
        local = tmp_path / "downloaded.parquet"
        local.write_bytes(data)

    rollouts, batch = read_rollouts(local)
    assert len(rollouts) == 4 and {r.step for r in rollouts} == {0}
    tokens = sum(len(r.output_tokens) for r in rollouts)
    assert events[0].units == tokens > 0
    verdict = validator_check(local, inference_task(), node.address, events[0].units, key)
    assert verdict["verdict"] == "accept" and verdict["rows"] == 4, verdict


def one_submission(cluster, node: str, seconds: float) -> tuple[list, str]:  # noqa: ANN001
    """The WorkSubmitted events once there are any (exactly one, by `node`), and its work key."""
    reader = EventReader(cluster.chain, pool_id=cluster.pool_id, kinds=("WorkSubmitted",))
    events = wait_until("WorkSubmitted for the rollout file",
                        lambda: reader.read(cluster.chain.deployment.block).events,
                        seconds, every=1.0)  # fmt: skip
    assert len(events) == 1 and events[0].node == node, events
    return events, events[0].work_key.removeprefix("0x")


def validator_check(local: Path, task: dict, node: str, units: int, key: str) -> dict:
    """`local` judged as the validator judges it (the same pipeline as `intellect-validator run`): the
    task's own settings, the submitter and the units claimed on chain, file-level TOPLOC statistics."""
    task_file = local.with_name("task.json")
    task_file.write_text(json.dumps(task))
    checked = subprocess.run(
        [str(Path(sys.executable).parent / "intellect-validator"), "check", str(local),
         "--node", node, "--work-units", str(units), "--work-key", "0x" + key,
         "--task", str(task_file), "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr[-2000:]
    return dict(json.loads(checked.stdout.strip().splitlines()[-1]))
