"""The inference workload with vLLM under `--runtime docker` (issue 57), end to end as a user runs it.

anvil + Redis + discovery + orchestrator + one `intellect-worker start --runtime docker`: a task naming
only `workload: {"type": "inference", "settings": {"backend": "vllm", ...}}` is rendered by the
inference plug-in to `intellect-workload-vllm:latest` (`make images-vllm`), the worker runs it in a
container of that image (its mounts, env and bridge socket, as any task), vLLM's V1 engine makes one
batch with TOPLOC proofs → the file is announced, uploaded, submitted on chain, and judged by the
validator's pipeline (`intellect-validator check`) under the shipped tiny record's vLLM part: accepted.

Needs a Docker engine and the vLLM image built on the current workload image; without them the test
skips with the reason, unless INTELLECT_REQUIRE_DOCKER=1 and INTELLECT_REQUIRE_VLLM=1 (CI), where it
fails.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_control_plane import wait_until  # noqa: E402
from test_inference_task import one_submission, validator_check  # noqa: E402
from test_task_execution import running_stack  # noqa: E402

from tests.support.testing import docker_problem  # noqa: E402
from workloads.inference.plugin import IMAGE, VLLM_IMAGE  # noqa: E402
from workloads.rollouts import PROOF_BYTES_PER_CHUNK, read_rollouts  # noqa: E402

MAX_NEW = 16
TASK = {
    "name": "vllm-rollouts",
    "workload": {
        "type": "inference",
        "settings": {"backend": "vllm", "batch_size": 2, "n": 2, "max_new_tokens": MAX_NEW, "max_batches": 1},
    },
    "storage_config": {"file_name_template": "step-0/${NODE_ADDRESS}/${CURRENT_FILE_INDEX}.parquet"},
}


def vllm_image_problem() -> str | None:
    """Why the vLLM image cannot run here, or None. An image built on an older workload image would
    run older code than the suite's: it counts as missing."""
    problem = docker_problem(IMAGE)  # the SDK, an engine, the workload image
    if problem is not None:
        return f"{problem} (the RL images: make images)"
    import docker
    from docker.errors import ImageNotFound

    client = docker.from_env(timeout=10)
    try:
        current = client.images.get(IMAGE).id
        built_on = client.images.get(VLLM_IMAGE).labels.get("org.intellect.workload")
    except ImageNotFound:
        return f"{VLLM_IMAGE} missing: run make images-vllm"
    finally:
        client.close()
    if built_on != current:  # images/build-vllm.sh labels the image with the workload image it copied
        return f"{VLLM_IMAGE} does not hold the current {IMAGE}'s code: run make images-vllm"
    return None


@pytest.fixture
def vllm_image() -> None:
    problem = vllm_image_problem()
    if problem is None:
        return
    if os.environ.get("INTELLECT_REQUIRE_DOCKER") == "1" and os.environ.get("INTELLECT_REQUIRE_VLLM") == "1":
        pytest.fail(f"INTELLECT_REQUIRE_DOCKER=1 and INTELLECT_REQUIRE_VLLM=1 but {problem}")
    pytest.skip(f"vLLM DOCKER END-TO-END SKIPPED: {problem}")


def task_log(task_id: str) -> str:
    """The task container's output, read through the engine as `docker logs` would."""
    import docker

    client = docker.from_env(timeout=10)
    try:
        [container] = client.containers.list(all=True, filters={"label": f"org.intellect.task_id={task_id}"})
        return str(container.logs().decode(errors="replace"))
    finally:
        client.close()


@pytest.mark.timeout(900)
def test_a_vllm_task_runs_in_its_image_and_its_file_is_accepted(vllm_image: None, tmp_path: Path) -> None:
    with running_stack("docker", tmp_path) as cluster:
        node = cluster.nodes[0]
        wait_until("the worker Healthy", lambda: cluster.state_of(0) == "Healthy", 90)
        created = cluster.orch("POST", "/tasks", json=TASK)
        assert created.status_code == 201, created.text
        task = created.json()
        # rendered by the plug-in: vLLM's image and the workload's program, the backend as its env var
        assert task["spec"]["image"] == VLLM_IMAGE, task
        assert task["spec"]["env_vars"]["INTELLECT_INFER_BACKEND"] == "vllm"

        events, key = one_submission(cluster, node.address, 600)
        info = cluster.orch("GET", f"/storage/files/{key}").json()
        assert info["file_name"] == f"step-0/{node.address}/0.parquet"
        data = httpx.get(info["url"], timeout=30).content
        assert hashlib.sha256(data).hexdigest() == key
        local = tmp_path / "downloaded.parquet"
        local.write_bytes(data)
        log = task_log(task["id"])

    # vLLM made it: its V1 engine started in the task's container, and every row carries its proofs
    assert "Initializing a V1 LLM engine" in log, log[-3000:]
    rollouts, batch = read_rollouts(local)
    assert len(rollouts) == 4 and batch.node_address == node.address and batch.task_id == task["id"]
    assert all(len(r.proofs) % PROOF_BYTES_PER_CHUNK == 0 and r.proofs for r in rollouts)
    tokens = sum(len(r.output_tokens) for r in rollouts)
    assert events[0].units == tokens > 0
    verdict = validator_check(local, TASK, node.address, events[0].units, key)
    assert verdict["verdict"] == "accept" and verdict["rows"] == 4, verdict
    judged = verdict["judged_by"]  # the shipped tiny record's vLLM part
    assert (judged["source"], judged["record"], judged["backend"]) == ("record", "tiny", "vllm"), verdict
