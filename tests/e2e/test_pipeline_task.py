"""A pipeline task end to end through the protocol: two real workers form a group and each pays its member.

anvil + Redis + discovery + orchestrator (topology `2x0GB`) + two `intellect-worker start --runtime
process`, each advertising its own p2p port. A trainer POSTs a `pipeline` task; the orchestrator groups
the two nodes and hands each its place, the next member's address, its own transport secret and both
members' public keys; each worker runs its member (`python -m workloads.pipeline task`, its stage only);
the two members stream activations over their authenticated sockets; each writes the batch and its
worker uploads it and submits it on chain for its share. Both files are then judged by
`intellect-validator check` with the task's plug-in: accepted, and the two shares add up to the batch's
tokens. A member killed mid-run is restarted by its worker, the other times out on it and restarts too,
the group goes on from the first batch it lacks: every batch is submitted exactly once by each member.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_control_plane import Cluster, Service, cluster_stack, wait_until  # noqa: E402

from intellect.net import stable_port  # noqa: E402
from ledger.audit import Auditor  # noqa: E402
from ledger.events import EventReader  # noqa: E402
from ledger.group_audit import GroupAuditor  # noqa: E402
from workloads.pipeline.files import read_group_file  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SETTINGS = {"batch_size": 2, "batches": 1, "max_new_tokens": 8}


class GroupCluster(Cluster):
    def base_env(self) -> dict[str, str]:
        return super().base_env() | {"INTELLECT_ORCH_TOPOLOGY_NAMES": '["2x0GB"]'}

    def pipeline_worker(self, index: int) -> Service:
        service = self.worker_service(index)
        service.argv[service.argv.index("recording")] = "process"
        service.env |= {"INTELLECT_WORKER_P2P_PORT": str(stable_port(span=2)),
                        "INTELLECT_WORKER_STOP_TASKS_ON_EXIT": "1"}
        return service


def group_stack(tmp: Path) -> AbstractContextManager[GroupCluster]:
    return cluster_stack(tmp, "pipe", 2, GroupCluster, GroupCluster.pipeline_worker)


def pipeline_task() -> dict:
    return {
        "name": "pipe",
        "entrypoint": [sys.executable, "-m", "workloads.pipeline", "task"],
        "env_vars": {"PYTHONPATH": str(REPO)},
        "workload": {"type": "pipeline", "settings": SETTINGS},
        "scheduling_config": {"plugins": {"node_groups": {"allowed_topologies": ["2x0GB"]}}},
        "storage_config": {"file_name_template": "${TASK_ID}/${NODE_ADDRESS}/${ORIGINAL_NAME}"},
    }


def test_a_pipeline_task_runs_across_two_workers_and_pays_each_member(tmp_path: Path) -> None:
    with group_stack(tmp_path) as cluster:
        for i in (0, 1):
            wait_until(f"worker {i} Healthy", lambda i=i: cluster.state_of(i) == "Healthy", 120)
        refused = cluster.orch("POST", "/tasks", json={**pipeline_task(), "scheduling_config": None})
        assert refused.status_code == 422 and "topolog" in refused.text, refused.text
        created = cluster.orch("POST", "/tasks", json=pipeline_task())
        assert created.status_code == 201, created.text

        reader = EventReader(cluster.chain, pool_id=cluster.pool_id, kinds=("WorkSubmitted",))

        def both() -> list | None:
            found = reader.read(cluster.chain.deployment.block).events
            return found if len(found) >= 2 else None

        events = wait_until("WorkSubmitted by both members", both, 420, every=1.0)
        assert {e.node for e in events} == {n.address for n in cluster.nodes}, events
        files = {}
        for event in events:
            key = event.work_key.removeprefix("0x")
            stored = cluster.orch("GET", f"/storage/files/{key}")
            assert stored.status_code == 200, stored.text
            data = httpx.get(stored.json()["url"], timeout=30).content
            assert hashlib.sha256(data).hexdigest() == key
            local = tmp_path / f"{event.node}.json"
            local.write_bytes(data)
            files[event.node] = (local, event)
        # The pool owner's audit of the batch: both members, their layers and units, as the chain has them.
        [audit] = GroupAuditor(Auditor(cluster.chain)).audit([path for path, _ in files.values()]).batches
        assert audit.problems == [], audit.problems
        stages = {node: read_group_file(path).stage for node, (path, _) in files.items()}
        assert [m.node for m in audit.members] == sorted(files, key=stages.__getitem__)
        assert all(m.units_on_chain == m.units == files[m.node][1].units for m in audit.members), audit
        assert [m.layers for m in audit.members] == [(0, 2), (2, 4)]

    batches = {node: read_group_file(path) for node, (path, _) in files.items()}
    by_stage = sorted(batches.values(), key=lambda b: b.stage)
    assert [b.stage for b in by_stage] == [0, 1] and by_stage[0].outputs == by_stage[1].outputs
    assert [b.node for b in by_stage] == by_stage[0].members  # each file names its submitter
    tokens = by_stage[0].output_tokens()
    units = {node: event.units for node, (_, event) in files.items()}
    assert sum(units.values()) >= tokens > 0 and all(u > 0 for u in units.values())

    task_file = tmp_path / "task.json"
    task_file.write_text(json.dumps(pipeline_task()))
    for node, (path, event) in files.items():
        checked = subprocess.run(
            [str(Path(sys.executable).parent / "intellect-validator"), "check", str(path), "--node", node,
             "--work-units", str(event.units), "--work-key", event.work_key, "--task", str(task_file),
             "--json"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
        assert json.loads(checked.stdout.strip().splitlines()[-1])["verdict"] == "accept"


def member_process(index: int, under: Path) -> psutil.Process | None:
    """The pipeline member of group index `index` whose data folder is under `under` (this test's: other
    tests may run pipeline members at the same time)."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "-m workloads.pipeline task" in " ".join(proc.info["cmdline"] or []):
                env = proc.environ()
                if env.get("INTELLECT_PIPELINE_GROUP_INDEX") == str(index) and \
                        env.get("INTELLECT_DATA_DIR", "").startswith(str(under)):  # fmt: skip
                    return proc
        except psutil.Error:
            continue
    return None


def test_a_member_killed_mid_run_costs_its_batch_only_and_nothing_is_credited_twice(tmp_path: Path) -> None:
    settings = {"batch_size": 2, "batches": 4, "max_new_tokens": 32, "timeout_seconds": 8}
    task = {**pipeline_task(), "workload": {"type": "pipeline", "settings": settings}}
    with group_stack(tmp_path) as cluster:
        for i in (0, 1):
            wait_until(f"worker {i} Healthy", lambda i=i: cluster.state_of(i) == "Healthy", 120)
        assert cluster.orch("POST", "/tasks", json=task).status_code == 201
        victim = wait_until("member 1 running", lambda: member_process(1, tmp_path), 180)
        folder = Path(victim.environ()["INTELLECT_DATA_DIR"]) / "pipeline"
        wait_until("member 1's first batch written", lambda: any(folder.glob("pipeline-batch000001-*")), 180)
        victim.kill()  # mid-run: the worker restarts it; member 0 times out on it and restarts too
        reader = EventReader(cluster.chain, pool_id=cluster.pool_id, kinds=("WorkSubmitted",))

        def all_in() -> list | None:
            found = reader.read(cluster.chain.deployment.block).events
            return found if len(found) >= 8 else None

        events = wait_until("every batch submitted by both members", all_in, 420, every=1.0)
        time.sleep(5)  # anything submitted twice would show up now
        events = reader.read(cluster.chain.deployment.block).events
        batches: dict[str, list[int]] = {}
        for event in events:
            stored = cluster.orch("GET", f"/storage/files/{event.work_key.removeprefix('0x')}").json()
            data = tmp_path / "f.json"
            data.write_bytes(httpx.get(stored["url"], timeout=30).content)
            batches.setdefault(event.node, []).append(read_group_file(data).batch)
    assert {n: sorted(b) for n, b in batches.items()} == {n.address: [1, 2, 3, 4] for n in cluster.nodes}
