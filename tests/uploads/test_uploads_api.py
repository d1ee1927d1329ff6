"""`POST /storage/request-upload` and `GET /storage/files/{sha256}` against a real orchestrator, anvil,
Redis and the embedded local-disk storage, over real HTTP."""

from __future__ import annotations

import hashlib
import os
import time

import httpx
import pytest
from uploads_world import Orchestrator, joined_nodes, make_healthy

from intellect.identity import Wallet
from intellect.signing import SignedAuth
from intellect.wire.heartbeat import HeartbeatRequest, TaskStatus
from intellect.wire.storage import UploadGrant, UploadRequest
from intellect.wire.tasks import TaskState

RATE = 10
GRACE = 6  # seconds a node that worked on a deleted task may still upload its files


@pytest.fixture(scope="module")
def world(devnet, redis_url, tmp_path_factory):
    orch = Orchestrator(devnet, redis_url, tmp_path_factory.mktemp("orch"), upload_max_bytes=4096,
                        upload_rate_limit_per_minute=RATE, upload_grace_seconds=GRACE).start()
    nodes = joined_nodes(devnet, 5)
    make_healthy(orch, nodes)
    yield orch, nodes
    orch.stop()


def req(task_id: str, data: bytes, name: str = "out.bin", units: int = 3) -> UploadRequest:
    return UploadRequest(task_id=task_id, original_name=name, size_bytes=len(data),
                         sha256=hashlib.sha256(data).hexdigest(), work_units=units)


def test_refusals(world) -> None:
    orch, nodes = world
    node = nodes[0]
    task = orch.create_task({"name": "plain", "image": "i"})
    data = b"x" * 100
    # unknown node: signed correctly, but never in this pool
    r = orch.request_upload(Wallet.create(), req(task, data))
    assert r.status_code == 404 and "not known" in r.json()["detail"]
    # unsigned
    r = httpx.post(orch.url + "/storage/request-upload", content=req(task, data).model_dump_json())
    assert r.status_code == 401
    # not assigned that task
    r = orch.request_upload(node, req("some-other-task", data))
    assert r.status_code == 403 and "not assigned task some-other-task" in r.json()["detail"]
    # too large (limit 4096)
    big = UploadRequest(task_id=task, original_name="big", size_bytes=4097, sha256="0" * 64, work_units=1)
    r = orch.request_upload(node, big)
    assert r.status_code == 413 and "upload_max_bytes" in r.json()["detail"]
    # malformed body: unknown field, bad hash
    r = orch.request_upload(node, {**req(task, data).model_dump(), "node_address": node.address})
    assert r.status_code == 422
    r = orch.request_upload(node, {**req(task, data).model_dump(), "sha256": "XYZ"})
    assert r.status_code == 422
    # a template that would escape the store never gets in: the task itself is refused
    escape = {"file_name_template": "../${ORIGINAL_NAME}"}
    r = orch.admin("POST", "/tasks", json={"name": "bad", "image": "i", "storage_config": escape})
    assert r.status_code == 422 and "must not contain '..'" in r.text
    # group variables for a task that is not in a node group
    group_vars = {"file_name_template": "${NODE_GROUP_ID}/${ORIGINAL_NAME}"}
    grouped = orch.create_task({"name": "g", "image": "i", "storage_config": group_vars})
    r = orch.request_upload(node, req(grouped, data))
    assert r.status_code == 422 and "${NODE_GROUP_ID}" in r.json()["detail"]
    # an unknown variable never gets in: the task itself is refused
    r = orch.admin("POST", "/tasks", json={"name": "u", "image": "i",
                                           "storage_config": {"file_name_template": "${NOPE}"}})
    assert r.status_code == 422 and "${NOPE}" in r.text
    # nothing was recorded for the refused requests
    r = orch.admin("GET", f"/storage/files/{hashlib.sha256(data).hexdigest()}")
    assert r.status_code == 404


def test_rate_limit_per_node(world) -> None:
    orch, nodes = world
    task = orch.create_task({"name": "rate", "image": "i"})
    codes = [orch.request_upload(nodes[1], req(task, os.urandom(8))).status_code for _ in range(RATE + 1)]
    assert codes[:RATE] == [200] * RATE and codes[RATE] == 429
    # another node is not affected
    assert orch.request_upload(nodes[2], req(task, os.urandom(8))).status_code == 200


def test_grant_put_download_and_duplicates(world, devnet) -> None:
    orch, nodes = world
    node, other = nodes[3], nodes[2]
    template = "${TASK_ID}/${NODE_ADDRESS}/${CURRENT_FILE_INDEX}-${ORIGINAL_NAME}"
    task = orch.create_task({"name": "rollouts", "image": "i",
                             "storage_config": {"file_name_template": template}})
    data = os.urandom(3000)
    sha = hashlib.sha256(data).hexdigest()
    first = orch.request_upload(node, req(task, data, "step-1.parquet"))
    assert first.status_code == 200, first.text
    grant = UploadGrant.model_validate(first.json())
    assert grant.file_name == f"{task}/{node.address}/0-step-1.parquet"
    # asked again before the PUT (lost reply): the same grant
    again = UploadGrant.model_validate(orch.request_upload(node, req(task, data, "step-1.parquet")).json())
    assert (again.upload_id, again.file_name) == (grant.upload_id, grant.file_name)
    # a bit flipped in transit: refused, nothing stored
    bad = bytearray(data)
    bad[0] ^= 1
    assert httpx.put(grant.url, content=bytes(bad), headers=grant.headers).status_code == 400
    assert orch.admin("GET", f"/storage/files/{sha}").status_code == 404
    put = httpx.put(grant.url, content=data, headers=grant.headers)
    assert put.status_code == 201, put.text
    # the PUT completed the record: asking again is a clear 409, another node's copy too
    r = orch.request_upload(node, req(task, data, "step-1.parquet"))
    assert r.status_code == 409 and r.json()["detail"].startswith("already uploaded as")
    r = orch.request_upload(other, req(task, data, "copy.parquet"))
    assert r.status_code == 409 and "another node" in r.json()["detail"]
    # a replayed URL cannot overwrite it
    assert httpx.put(grant.url, content=data, headers=grant.headers).status_code == 409
    # the next file of the node gets the next index
    second = orch.request_upload(node, req(task, b"second", "step-2.parquet")).json()
    assert second["file_name"] == f"{task}/{node.address}/1-step-2.parquet"

    # downloads: admin, a validator (on-chain role), not a stranger
    r = orch.admin("GET", f"/storage/files/{sha}")
    assert r.status_code == 200, r.text
    stored = r.json()
    assert stored["file_name"] == grant.file_name and stored["node_address"] == node.address
    assert stored["work_units"] == 3 and stored["size_bytes"] == len(data)
    assert hashlib.sha256(httpx.get(stored["url"]).content).hexdigest() == sha
    validator = Wallet.create()
    devnet.client(devnet.owner).grant_validator(validator.address)
    r = httpx.get(f"{orch.url}/storage/files/{sha}", auth=SignedAuth(validator))
    assert r.status_code == 200 and r.json()["sha256"] == sha
    r = httpx.get(f"{orch.url}/storage/files/{sha}?redirect=true", auth=SignedAuth(validator))
    assert r.status_code == 307 and "/storage/objects/" in r.headers["location"]
    r = httpx.get(f"{orch.url}/storage/files/{sha}", auth=SignedAuth(Wallet.create()))
    assert r.status_code == 403 and "validator" in r.json()["detail"]
    assert httpx.get(f"{orch.url}/storage/files/{sha}").status_code == 401
    bad = orch.admin("GET", "/storage/files/nothex")  # the path's pattern is in the OpenAPI document
    assert bad.status_code == 422 and "sha256" in bad.text

    # the counter and the records survive a restart
    orch.restart()
    make_healthy(orch, [node])
    third = orch.request_upload(node, req(task, b"third", "step-3.parquet")).json()
    assert third["file_name"] == f"{task}/{node.address}/2-step-3.parquet"
    assert orch.admin("GET", f"/storage/files/{sha}").status_code == 200


def test_template_collision_is_a_clear_409(world) -> None:
    orch, nodes = world
    task = orch.create_task({"name": "fixed", "image": "i",
                             "storage_config": {"file_name_template": "${TASK_ID}/result.bin"}})
    assert orch.request_upload(nodes[4], req(task, b"one")).status_code == 200
    r = orch.request_upload(nodes[4], req(task, b"two"))
    assert r.status_code == 409 and "CURRENT_FILE_INDEX" in r.json()["detail"]


def test_files_in_flight_when_a_task_is_deleted_may_still_be_uploaded_for_a_while(world) -> None:
    """A run that ends deletes its task while workers still upload what they made in its last seconds
    (seen in the multi-host demo: an honest file refused, never paid), and a dissolved group leaves its
    members unassigned with files in flight. A node that reported working on the task may upload its
    files while the task lives and for `upload_grace_seconds` after its deletion; a node that never
    did, or later, is refused."""
    orch, nodes = world
    worker, stranger = nodes[3], nodes[4]
    task = orch.create_task({"name": "ending", "image": "i"})
    beat = HeartbeatRequest(task=TaskStatus(task_id=task, state=TaskState.RUNNING))
    assert orch.heartbeat(worker, beat).status_code == 200  # the worker's report: it runs the task
    newer = orch.create_task({"name": "next", "image": "i"})  # the node is moved on: the task still lives
    assert orch.assigned(worker)["task"]["id"] == newer
    r = orch.request_upload(worker, req(task, os.urandom(32)))
    assert r.status_code == 200, r.text
    assert orch.admin("DELETE", f"/tasks/{task}").status_code == 200
    r = orch.request_upload(worker, req(task, os.urandom(32)))
    assert r.status_code == 200, r.text
    r = orch.request_upload(stranger, req(task, os.urandom(32)))
    assert r.status_code == 403 and "nor did it work on it" in r.json()["detail"]
    time.sleep(GRACE + 1)
    r = orch.request_upload(worker, req(task, os.urandom(32)))
    assert r.status_code == 403 and f"less than {GRACE} s ago" in r.json()["detail"]
    assert orch.admin("DELETE", f"/tasks/{newer}").status_code == 200
