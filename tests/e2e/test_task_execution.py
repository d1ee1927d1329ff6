"""Task execution end to end, every component real and in its own process, for both runtimes.

anvil + Redis + `intellect-discovery serve` + `intellect-orchestrator serve` + one
`intellect-worker start --runtime {docker,process}`: a trainer POSTs a task → the worker runs it (a
container from `intellect-test:latest`, or a process tree) → the workload writes a file and announces
it on the bridge → the worker gets a signed URL and PUTs it → `WorkSubmitted` on chain with the
file's sha256 → the stored file's sha256 matches. Then: a duplicate submission is refused (on chain
and by the orchestrator), nothing half-written is left, and a killed + restarted worker submits
nothing twice.

Docker runs need a reachable engine and the test image (`scripts/ci-docker.sh`); without them the
docker case skips with the reason, unless INTELLECT_REQUIRE_DOCKER=1 (CI), where it fails.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_control_plane import Cluster, Service, cluster_stack, wait_until  # noqa: E402

from intellect.identity import Wallet  # noqa: E402
from intellect.signing import SignedAuth  # noqa: E402
from intellect.wire.storage import UploadRequest  # noqa: E402
from ledger.client import LedgerClient  # noqa: E402
from ledger.errors import ContractRevert  # noqa: E402
from ledger.events import EventReader  # noqa: E402
from tests.support import testing  # noqa: E402
from worker.files import WorkerFiles  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("INTELLECT_TEST_IMAGE", "intellect-test:latest")
PAYLOAD = "rollout-bytes-" + "x" * 4000  # what the workload writes (its sha256 is the work key)
UNITS = 7


def docker_problem() -> str | None:
    return testing.docker_problem(IMAGE)


def stop_task(kind: str, cluster: Cluster) -> None:
    """What the worker leaves running on purpose (adoption), removed the way a worker would."""
    from worker.runtime import start_runtime

    state = cluster.tmp / "worker0"
    runtime = start_runtime(kind, cluster.nodes[0].address, state, storage_root=state / "data")  # type: ignore[arg-type]
    try:
        runtime.apply(None)
    finally:
        runtime.close()


def running_stack(kind: str, tmp: Path) -> AbstractContextManager[Cluster]:
    """anvil + Redis + discovery + orchestrator + one worker with runtime `kind`, all stopped after."""
    return cluster_stack(tmp, "exec", 1, Cluster, lambda cluster, _: worker_service(cluster, kind),
                         after=lambda cluster: stop_task(kind, cluster))


@pytest.fixture(scope="module", params=["docker", "process"])
def stack(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Cluster]]:
    kind = request.param
    if kind == "docker":
        problem = docker_problem()
        if problem:
            if os.environ.get("INTELLECT_REQUIRE_DOCKER") == "1":
                pytest.fail(f"Docker required (INTELLECT_REQUIRE_DOCKER=1) but {problem}")
            pytest.skip(f"DOCKER END-TO-END SKIPPED: {problem}")
    with running_stack(kind, tmp_path_factory.mktemp(f"exec-{kind}")) as cluster:
        yield kind, cluster


def worker_service(cluster: Cluster, kind: str) -> Service:
    service = cluster.worker_service(0)
    service.argv += ["--runtime", kind]
    return service


def task_spec(kind: str) -> dict:
    actions = [f"write:rollouts.bin:{PAYLOAD}", f"announce:rollouts.bin:{UNITS}", "print:done", "sleep:600"]
    if kind == "docker":
        entrypoint, env = ["python3", "/opt/intellect/workload.py"], {}
    else:
        entrypoint = [sys.executable, str(REPO / "images" / "test" / "workload.py")]
        env = {"PYTHONPATH": str(REPO)}
    return {
        "name": "rollouts", "image": IMAGE, "entrypoint": entrypoint, "cmd": actions, "env_vars": env,
        "storage_config": {
            "file_name_template": "${TASK_ID}/${NODE_ADDRESS}/${CURRENT_FILE_INDEX}-${ORIGINAL_NAME}"},
    }


def submitted(cluster: Cluster, key: str) -> list:
    reader = EventReader(cluster.chain, pool_id=cluster.pool_id, kinds=("WorkSubmitted",))
    return [e for e in reader.read(cluster.chain.deployment.block).events if e.work_key == "0x" + key]


def test_task_output_is_uploaded_and_submitted_once(stack: tuple[str, Cluster]) -> None:
    kind, cluster = stack
    node = cluster.nodes[0]
    key = hashlib.sha256(PAYLOAD.encode()).hexdigest()
    wait_until("the worker Healthy", lambda: cluster.state_of(0) == "Healthy", 90)
    created = cluster.orch("POST", "/tasks", json=task_spec(kind))
    assert created.status_code == 201, created.text
    task_id = created.json()["id"]

    events = wait_until("WorkSubmitted for the file's sha256", lambda: submitted(cluster, key), 90, every=0.5)
    assert len(events) == 1
    event = events[0]
    assert event.node == node.address and event.units == UNITS and event.pool_id == cluster.pool_id
    record = cluster.chain.get_work(cluster.pool_id, "0x" + key)
    assert record is not None and record.node == node.address

    # the stored file is the file the workload wrote, under the task's file name template
    stored = cluster.orch("GET", f"/storage/files/{key}")
    assert stored.status_code == 200, stored.text
    info = stored.json()
    assert info["file_name"] == f"{task_id}/{node.address}/0-rollouts.bin"
    assert hashlib.sha256(httpx.get(info["url"], timeout=10).content).hexdigest() == key
    on_disk = cluster.tmp / "orchestrator" / "storage" / "objects" / info["file_name"]
    assert hashlib.sha256(on_disk.read_bytes()).hexdigest() == key

    # the worker recorded the upload and the transaction
    queue = WorkerFiles(cluster.tmp / "worker0" / "bridge" / "files.sqlite")
    wait_until("the queue entry marked submitted", lambda: queue.all() and queue.all()[0].tx_hash, 10)
    [entry] = queue.all()
    assert entry.sha256 == key and entry.tx_hash == event.tx_hash and entry.upload_ref == info["file_name"]
    # the task's state reaches the orchestrator with the worker's heartbeats
    reported = wait_until("the task reported running", lambda: (
        cluster.node_states()[node.address].get("task") or {}).get("state") == "running"
        and cluster.node_states()[node.address]["task"], 30)
    assert reported["task_id"] == task_id


def test_duplicates_are_refused_and_nothing_is_half_written(stack: tuple[str, Cluster]) -> None:
    kind, cluster = stack
    node = cluster.nodes[0]
    key = hashlib.sha256(PAYLOAD.encode()).hexdigest()
    provider = LedgerClient(cluster.anvil.rpc_url, cluster.deployment,
                            Wallet.from_key(cluster.anvil.dev_keys[3]))
    with pytest.raises(ContractRevert) as revert:
        provider.submit_work(cluster.pool_id, node.address, "0x" + key, UNITS)
    assert revert.value.error_name == "WorkAlreadySubmitted"
    # the orchestrator will not grant a second upload of the same content
    tasks = cluster.orch("GET", "/tasks").json()
    again = UploadRequest(task_id=tasks[-1]["id"], original_name="rollouts.bin", size_bytes=len(PAYLOAD),
                          sha256=key, work_units=UNITS)
    r = httpx.post(f"{cluster.orch_url}/storage/request-upload", content=again.model_dump_json(),
                   auth=SignedAuth(node), timeout=10)
    assert r.status_code == 409 and r.json()["detail"].startswith("already uploaded")
    # nothing half-written: no partial upload, no queued file, exactly one submission
    assert list((cluster.tmp / "orchestrator" / "storage" / "incoming").iterdir()) == []
    queue = WorkerFiles(cluster.tmp / "worker0" / "bridge" / "files.sqlite")
    assert queue.pending_upload() == [] and queue.pending_submission() == []
    assert len(submitted(cluster, key)) == 1

    # kill -9 the worker and start it again: it adopts the running task and submits nothing twice
    victim = cluster.workers[0]
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=10)
    cluster.workers[0] = worker_service(cluster, kind).start()
    wait_until("the restarted worker Healthy", lambda: cluster.state_of(0) == "Healthy", 60)
    wait_until("the restarted worker reporting the task", lambda: (
        cluster.node_states()[node.address].get("task") or {}).get("state") == "running", 30)
    time.sleep(5)  # two upload passes of the restarted worker
    assert len(submitted(cluster, key)) == 1
    assert len(queue.all()) == 1
