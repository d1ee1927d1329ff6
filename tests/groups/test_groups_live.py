"""Node groups end to end in the orchestrator: real anvil, Redis, uvicorn, signed heartbeats.

4 nodes + a "2x0GB" task → two groups with the right `${GROUP_*}` values (and file names); one member
stops heartbeating → Dead → its group dissolves, the other group keeps running, and the task gets a
new group once a fifth node arrives; a restart keeps every group; deleting the task frees the nodes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "uploads"))

import httpx  # noqa: E402
import pytest  # noqa: E402
from uploads_world import Heartbeats, Orchestrator, joined_nodes, make_healthy, wait_for  # noqa: E402

from intellect.wire.storage import UploadRequest  # noqa: E402

LIVENESS = dict(heartbeat_ttl_seconds=1.5, check_interval_seconds=0.5, miss_threshold=2)


@pytest.fixture
def orch(devnet, redis_url, tmp_path):
    orch = Orchestrator(devnet, redis_url, tmp_path / "orch", **LIVENESS).start()
    yield orch
    orch.stop()


def group_of(beats: Heartbeats, address: str) -> dict | None:
    status, reply = beats.replies.get(address, (0, None))
    task = (reply or {}).get("current_task") if status == 200 else None
    return (task or {}).get("group")


def task_of(beats: Heartbeats, address: str) -> str | None:
    status, reply = beats.replies.get(address, (0, None))
    task = (reply or {}).get("current_task") if status == 200 else None
    return task["task"]["id"] if task else None


def groups_now(beats: Heartbeats, nodes) -> dict[str, list[tuple[int, int, str]]]:
    out: dict[str, list] = {}
    for node in nodes:
        g = group_of(beats, node.address)
        if g:
            out.setdefault(g["group_id"], []).append((g["group_index"], g["group_size"], node.address))
    return out


def test_groups_form_dissolve_reform_and_survive_restart(orch, devnet) -> None:
    nodes = joined_nodes(devnet, 4)
    make_healthy(orch, nodes)
    beats = Heartbeats(orch, nodes).start()
    try:
        plain = orch.create_task({"name": "plain", "image": "i"})
        template = "${NODE_GROUP_ID}/${NODE_GROUP_INDEX}-of-${NODE_GROUP_SIZE}/${CURRENT_FILE_INDEX}.bin"
        grouped = orch.create_task({
            "name": "pipeline", "image": "i",
            "cmd": ["run", "${GROUP_ID}", "${GROUP_INDEX}", "${GROUP_SIZE}"],
            "scheduling_config": {"plugins": {"node_groups": {"allowed_topologies": ["2x0GB"]}}},
            "storage_config": {"file_name_template": template},
        })
        wait_for(lambda: len(groups_now(beats, nodes)) == 2 and
                 all(len(m) == 2 for m in groups_now(beats, nodes).values()), 15, "two groups of two")
        groups = groups_now(beats, nodes)
        for members in groups.values():
            assert sorted((i, size) for i, size, _ in members) == [(0, 2), (1, 2)]
        assert {task_of(beats, n.address) for n in nodes} == {grouped}  # the plain task waits
        # GET /groups (the dashboard's Groups panel) lists the same groups, members in position order
        listed = orch.admin("GET", "/groups")
        assert listed.status_code == 200, listed.text
        by_id = {g["id"]: g for g in listed.json()["groups"]}
        assert set(by_id) == set(groups)
        for gid, members in groups.items():
            assert by_id[gid]["nodes"] == [a for _, _, a in sorted(members)]
            assert by_id[gid]["task_id"] == grouped and by_id[gid]["topology"] == "2x0GB"
        assert httpx.get(orch.url + "/groups", timeout=10).status_code == 401  # admin only
        # file names from the group placement
        member = nodes[0]
        mine = group_of(beats, member.address)
        r = orch.request_upload(member, UploadRequest(task_id=grouped, original_name="x", size_bytes=1,
                                                      sha256="ab" * 32, work_units=1))
        assert r.status_code == 200, r.text
        assert r.json()["file_name"] == f"{mine['group_id']}/{mine['group_index']}-of-2/0.bin"

        # kill one member: its group dissolves, its partner is freed (and runs the plain task)
        victim = nodes[0]
        partner = next(a for _, _, a in groups[mine["group_id"]] if a != victim.address)
        survivor_group = next(g for g in groups if g != mine["group_id"])
        beats.silence(victim)
        wait_for(lambda: orch.state_of(victim) in ("Dead", "Ejected"), 15, "victim Dead")
        wait_for(lambda: group_of(beats, partner) is None, 10, "the victim's group to dissolve")
        assert task_of(beats, partner) == plain
        assert set(groups_now(beats, nodes[1:])) == {survivor_group}  # the victim's last reply is stale
        audit_ok = orch.admin("GET", f"/tasks/{grouped}")
        assert audit_ok.status_code == 200 and not audit_ok.json()["deleted"]

        # a fifth node arrives: the task gets a new group (partner + newcomer)
        newcomer = joined_nodes(devnet, 1)[0]
        make_healthy(orch, [newcomer])
        beats.add(newcomer)
        everyone = [*nodes[1:], newcomer]
        wait_for(lambda: len(groups_now(beats, everyone)) == 2 and
                 all(len(m) == 2 for m in groups_now(beats, everyone).values()), 15, "a new group")
        reformed = groups_now(beats, everyone)
        new_group = next(g for g in reformed if g != survivor_group)
        assert {a for _, _, a in reformed[new_group]} == {partner, newcomer.address}
        assert new_group != mine["group_id"]

        # restart: groups and memberships come back from SQL unchanged
        before = groups_now(beats, everyone)
        orch.restart()
        wait_for(lambda: all(beats.replies.get(n.address, (0,))[0] == 200 for n in everyone), 10, "beats")
        beats.replies.clear()
        wait_for(lambda: len(beats.replies) == len(everyone), 10, "fresh replies")
        assert groups_now(beats, everyone) == before

        # deleting the task dissolves its groups; every node runs the plain task again
        assert orch.admin("DELETE", f"/tasks/{grouped}").status_code == 200
        wait_for(lambda: not groups_now(beats, everyone) and
                 {task_of(beats, n.address) for n in everyone} == {plain}, 10, "groups gone")
    finally:
        beats.stop()


def test_unknown_topology_is_refused(orch) -> None:
    spec = {"name": "t", "image": "i",
            "scheduling_config": {"plugins": {"node_groups": {"allowed_topologies": ["lots-of-gpus"]}}}}
    r = orch.admin("POST", "/tasks", json=spec)
    assert r.status_code == 422 and "unknown topology 'lots-of-gpus'" in r.json()["detail"]
