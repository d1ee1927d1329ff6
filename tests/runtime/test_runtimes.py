"""One behavioural suite, run against the process runtime and the Docker runtime (real engine)."""

from __future__ import annotations

import hashlib
import json
import shutil
import time

from intellect.wire.tasks import GroupContext, TaskState, VolumeMount
from worker.runtime.base import run_name

from .helpers import Harness, in_state, wait_for

FINISHED = in_state(TaskState.COMPLETED, TaskState.FAILED)


def count_lines(path) -> int:  # type: ignore[no-untyped-def]
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_runs_to_completion_with_templates_logs_and_dirs(harness: Harness) -> None:
    runtime = harness.runtime(p2p_port=4100)
    spec = harness.spec(
        "print:hello from the task",
        "env:GREETING",
        "env:INTELLECT_TASK_ID",
        "env:SEED",
        "env:PEER",
        "env:SOCK",
        "write:out.txt:result",
        "exit:0",
        env_vars={
            "GREETING": "${TASK_ID}@${NODE_ADDRESS} g=${GROUP_ID}/${GROUP_INDEX}/"
            "${GROUP_SIZE} next=${NEXT_P2P_ADDRESS}",
            "SEED": "${WORKER_P2P_SEED}",
            "PEER": "${GROUP_SECRET}@${WORKER_P2P_PORT}",
            "SOCK": "${SOCKET_PATH}",
        },
    )
    group = GroupContext(group_id="g1", group_index=1, group_size=2, next_p2p_address="/ip4/10.0.0.2/tcp/1",
                         secret="5e" * 32)
    desired = harness.assign(spec, group=group)
    status = wait_for(runtime, desired, FINISHED)
    assert status.state == TaskState.COMPLETED, status
    assert status.exit_code == 0
    assert status.task_id == desired.task.id
    assert status.config_hash == spec.config_hash()
    logs = "\n".join(runtime.logs(tail=50))
    assert "hello from the task" in logs
    assert f"GREETING={desired.task.id}@{harness.node} g=g1/1/2 next=/ip4/10.0.0.2/tcp/1" in logs
    assert f"INTELLECT_TASK_ID={desired.task.id}" in logs
    assert "SEED=seed-42" in logs
    assert f"PEER={'5e' * 32}@4100" in logs
    expected_socket = (
        "/run/intellect/bridge.sock" if harness.kind == "docker" else str(harness.bridge.socket_path)
    )
    assert f"SOCK={expected_socket}" in logs
    assert (harness.data_dir(desired) / "out.txt").read_text() == "result"
    assert runtime.logs(tail=1) == logs.splitlines()[-1:]
    # Idempotent: reconciling a completed task does not run it again.
    assert runtime.apply(desired).state == TaskState.COMPLETED
    assert "\n".join(runtime.logs(tail=50)).count("hello from the task") == 1


def test_the_operators_task_env_overrides_the_spec_but_not_the_bridge_variables(harness: Harness) -> None:
    runtime = harness.runtime(task_env={"MODE": "operator", "EXTRA": "x1", "INTELLECT_TASK_ID": "forged"})
    spec = harness.spec("env:MODE", "env:EXTRA", "env:KEPT", "env:INTELLECT_TASK_ID", "exit:0",
                        env_vars={"MODE": "spec", "KEPT": "from-spec"})  # fmt: skip
    desired = harness.assign(spec)
    status = wait_for(runtime, desired, FINISHED)
    assert status.state == TaskState.COMPLETED, status
    logs = "\n".join(runtime.logs(tail=50))
    assert "MODE=operator" in logs and "EXTRA=x1" in logs and "KEPT=from-spec" in logs
    assert f"INTELLECT_TASK_ID={desired.task.id}" in logs and "forged" not in logs


def test_failing_command_restarts_up_to_the_cap_then_fails(harness: Harness) -> None:
    runtime = harness.runtime(max_restarts=2)
    desired = harness.assign(harness.spec("count:starts", "print:about to fail", "exit:3"))
    status = wait_for(runtime, desired, in_state(TaskState.FAILED), timeout=30)
    assert status.exit_code == 3
    assert "3" in (status.detail or "")
    # One start plus two restarts, then no more.
    time.sleep(1.0)
    assert count_lines(harness.data_dir(desired) / "starts") == 3
    assert runtime.apply(desired).state == TaskState.FAILED


def test_a_template_variable_without_a_value_fails_the_task_with_the_reason(harness: Harness) -> None:
    runtime = harness.runtime()
    # ${GROUP_ID} is a known variable, but this task is not in a node group: no silent empty string.
    desired = harness.assign(harness.spec("env:G", env_vars={"G": "${GROUP_ID}"}))
    status = runtime.apply(desired)
    assert status.state == TaskState.FAILED
    assert "${GROUP_ID}" in status.detail and "node group" in status.detail
    assert runtime.apply(desired) == status  # idempotent, nothing started
    assert not harness.data_dir(desired).exists()
    # A worker without a p2p seed: the detail names the setting (not "no node group", as it once did).
    unseeded = harness.runtime(p2p_seed=None)
    desired = harness.assign(harness.spec("env:S", env_vars={"S": "${WORKER_P2P_SEED}"}))
    status = unseeded.apply(desired)
    assert status.state == TaskState.FAILED
    assert status.detail == ("template variable ${WORKER_P2P_SEED} has no value here: this worker has no p2p "
                             "seed configured (INTELLECT_WORKER_P2P_SEED)")
    # A spec from a newer orchestrator with a variable this worker does not know (bypassing validation).
    desired = harness.assign(harness.spec("print:x"))
    desired.task.spec.cmd[0] = "print:${BOGUS}"  # what an unvalidated spec could carry
    status = runtime.apply(desired)
    assert status.state == TaskState.FAILED and "${BOGUS}" in status.detail


def test_volume_mounts_stay_under_the_storage_root(harness: Harness) -> None:
    runtime = harness.runtime()
    volumes = harness.config().storage_root / "volumes"
    volumes.mkdir(parents=True)
    # A symlink planted under the storage root that points outside it: caught on the resolved path.
    (volumes / "escape").symlink_to("/etc")
    desired = harness.assign(
        harness.spec("print:x", volume_mounts=[VolumeMount(host_path="escape", container_path="/models")])
    )
    status = runtime.apply(desired)
    assert status.state == TaskState.FAILED
    assert "outside the worker's storage root" in status.detail
    # '..' that got past the wire model (e.g. a spec built without validation) is caught too.
    desired = harness.assign(harness.spec("print:x"))
    desired.task.spec.volume_mounts.append(
        VolumeMount.model_construct(host_path="../../etc", container_path="/models")
    )
    assert "outside the worker's storage root" in runtime.apply(desired).detail
    # A proper mount works and lands under <storage_root>/volumes.
    desired = harness.assign(
        harness.spec(
            "write:marker:1",
            env_vars={"OUT": "/models/weights.bin"},
            volume_mounts=[VolumeMount(host_path="models/a", container_path="/models")],
        )
    )
    if harness.kind == "docker":
        desired.task.spec.cmd.append("print:${TASK_ID}")
    status = wait_for(runtime, desired, FINISHED)
    assert status.state == TaskState.COMPLETED, status
    assert (volumes / "models" / "a").is_dir()


def test_a_changed_spec_replaces_the_running_task(harness: Harness) -> None:
    runtime = harness.runtime()
    first = harness.assign(
        harness.spec("env:VERSION", "sleep:60", env_vars={"VERSION": "1"}), task_id="replace-me"
    )
    wait_for(runtime, first, in_state(TaskState.RUNNING))
    second = harness.assign(
        harness.spec("env:VERSION", "sleep:60", env_vars={"VERSION": "2"}), task_id="replace-me"
    )
    assert second.task.spec.config_hash() != first.task.spec.config_hash()
    status = wait_for(runtime, second, in_state(TaskState.RUNNING))
    assert status.config_hash == second.task.spec.config_hash()
    deadline = time.monotonic() + 10
    while "VERSION=2" not in "\n".join(runtime.logs(tail=20)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "VERSION=2" in "\n".join(runtime.logs(tail=20))
    assert runtime.cleanup_stale() == []  # the old one is already gone
    # Only one run exists for this node: nothing of the first spec is left running.
    assert len(_owned(harness, runtime)) == 1


def _owned(harness: Harness, runtime) -> list[str]:  # type: ignore[no-untyped-def]
    if harness.kind == "docker":
        return [c.name for c in runtime._managed()]
    return [d.name for d in runtime.runs_dir.iterdir()]


def test_restart_runs_the_task_again(harness: Harness) -> None:
    runtime = harness.runtime()
    desired = harness.assign(harness.spec("count:starts", "sleep:60"))
    wait_for(runtime, desired, in_state(TaskState.RUNNING))
    starts = harness.data_dir(desired) / "starts"
    deadline = time.monotonic() + 10
    while count_lines(starts) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    status = runtime.restart()
    assert status is not None and status.task_id == desired.task.id
    wait_for(runtime, desired, in_state(TaskState.RUNNING))
    deadline = time.monotonic() + 10
    while count_lines(starts) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert count_lines(starts) == 2
    assert len(_owned(harness, runtime)) == 1


def test_follow_logs_until_the_task_ends(harness: Harness) -> None:
    runtime = harness.runtime()
    desired = harness.assign(harness.spec("print:one", "sleep:0.5", "print:two", "sleep:0.5", "print:three"))
    wait_for(runtime, desired, in_state(TaskState.RUNNING, TaskState.COMPLETED))
    lines = list(runtime.logs(tail=100, follow=True))
    text = "\n".join(lines)
    assert text.index("one") < text.index("two") < text.index("three")


def test_a_new_worker_adopts_the_running_task_without_duplicating_it(harness: Harness) -> None:
    first = harness.runtime()
    desired = harness.assign(harness.spec("count:starts", "sleep:60"))
    wait_for(first, desired, in_state(TaskState.RUNNING))
    first.close()  # the worker process goes away; its task keeps running
    second = harness.runtime()
    adopted = second.adopt()
    assert adopted is not None and adopted.task_id == desired.task.id and adopted.state == TaskState.RUNNING
    assert second.desired == desired
    # The next heartbeat brings the same task: nothing new is started.
    assert second.apply(desired).state == TaskState.RUNNING
    time.sleep(0.5)
    assert count_lines(harness.data_dir(desired) / "starts") == 1
    assert len(_owned(harness, second)) == 1
    assert second.restart().task_id == desired.task.id  # restart works on an adopted task


def test_a_restarted_worker_runs_its_task_again_when_it_failed_meanwhile(harness: Harness) -> None:
    """Issue 19.5: the task failed while no worker was there; the next worker runs it, not its ghost."""
    first = harness.runtime(max_restarts=0)
    desired = harness.assign(harness.spec("count:starts", "exit:1"))
    assert wait_for(first, desired, FINISHED).state == TaskState.FAILED
    first.close()
    second = harness.runtime(max_restarts=0)
    adopted = second.adopt()
    assert adopted is not None and adopted.state != TaskState.FAILED, adopted
    wait_for(second, desired, FINISHED)
    assert count_lines(harness.data_dir(desired) / "starts") == 2  # run once more, data kept


def test_stale_tasks_are_removed(harness: Harness) -> None:
    old_worker = harness.runtime()
    old = harness.assign(harness.spec("sleep:60"))
    wait_for(old_worker, old, in_state(TaskState.RUNNING))
    # A restarted worker that is now told to run a different task removes the old one.
    worker = harness.runtime()
    new = harness.assign(harness.spec("sleep:60"))
    status = wait_for(worker, new, in_state(TaskState.RUNNING))
    assert status.task_id == new.task.id
    assert _owned(harness, worker) == [run_name(new, harness.node)]
    # Nothing desired: everything is stopped and removed.
    assert worker.apply(None) is None
    assert _owned(harness, worker) == []
    assert worker.cleanup_stale() == []


def test_a_node_that_leaves_stops_its_task_from_a_fresh_runtime(harness: Harness) -> None:
    """`intellect-worker deregister`: the daemon is stopped (its task kept running, for adoption), then a
    runtime built from the state dir alone, with no bridge, stops and removes every run of the node."""
    worker = harness.runtime()
    desired = harness.assign(harness.spec("sleep:60"))
    wait_for(worker, desired, in_state(TaskState.RUNNING))
    worker.close()
    leaving = harness.runtime()
    leaving.bridge = None
    assert leaving.stop_all() == [run_name(desired, harness.node)]
    assert _owned(harness, leaving) == []
    assert harness.runtime().adopt() is None  # nothing left for a later worker to take over


def test_the_task_talks_to_the_worker_over_the_bridge(harness: Harness) -> None:
    runtime = harness.runtime()
    payload = "rollouts " * 100
    desired = harness.assign(
        harness.spec(
            "metrics:loss=0.25,tokens=1200",
            f"write:rollouts.bin:{payload}",
            "announce:rollouts.bin:16",
            'raw:{"type": "metrics", "task_id": "${TASK_ID}"}',
            'raw:{"type": "file_ready", "task_id": "${TASK_ID}", "path": "/etc/passwd", "sha256": "'
            + "0" * 64
            + '", "work_units": 1}',
            "raw:not json at all",
        )
    )
    status = wait_for(runtime, desired, FINISHED)
    logs = "\n".join(runtime.logs(tail=50))
    assert status.state == TaskState.COMPLETED, (status, logs)
    assert harness.bridge.metrics(desired.task.id) == {"loss": 0.25, "tokens": 1200.0}
    [queued] = harness.bridge.files.pending_upload()
    assert queued.task_id == desired.task.id and queued.work_units == 16
    assert queued.sha256 == hashlib.sha256(payload.encode()).hexdigest()
    assert queued.path == harness.data_dir(desired) / "rollouts.bin"
    replies = [json.loads(line.split("reply ", 1)[1]) for line in logs.splitlines() if "reply " in line]
    assert [r["ok"] for r in replies] == [False, False, False]
    assert "metrics" in replies[0]["error"]
    assert "outside the task's data directory" in replies[1]["error"]
    assert "invalid message" in replies[2]["error"]


def test_start_runtime_wires_the_bridge_and_adopts_after_a_worker_restart(harness: Harness, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from worker.runtime import start_runtime

    # pytest's tmp_path is deep: the socket falls back to a private dir in /tmp (AF_UNIX length limit).
    state_dir = tmp_path / ("deep-" * 12) / "worker"
    options = {"max_restarts": 1, "stop_timeout": 2}
    runtime = start_runtime(harness.kind, harness.node, state_dir, **options)
    assert runtime.kind == harness.kind and runtime.bridge is not None
    socket_path = runtime.bridge.socket_path
    assert len(str(socket_path)) <= 107 and socket_path.exists()
    spec = harness.spec("metrics:step=3", "sleep:60")
    desired = harness.assign(spec)
    try:
        wait_for(runtime, desired, in_state(TaskState.RUNNING))
        deadline = time.monotonic() + 10
        while runtime.metrics() != {"step": 3.0} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runtime.metrics() == {"step": 3.0}
        runtime.close()  # the worker stops: bridge gone, task still running
        assert not socket_path.exists()
        again = start_runtime(harness.kind, harness.node, state_dir, **options)
        assert again.desired == desired and again.status().state == TaskState.RUNNING
        assert again.apply(desired).state == TaskState.RUNNING
        assert again.apply(None) is None
        again.close()
    finally:
        runtime.apply(None)
        runtime.close()
        shutil.rmtree(socket_path.parent, ignore_errors=True)


def test_the_documented_bridge_example_runs_in_both_runtimes(harness: Harness) -> None:
    """docs/runtime.md's shell form, as a task would write it for a container: `python3` and `/data`
    inside a shell string. Under the process runtime `python3` is the worker's own interpreter and the
    paths in the string are the task's host dirs, so the same spec works in both runtimes."""
    runtime = harness.runtime()
    script = ("echo result > /data/out.txt && "
              "python3 -m workloads.bridge_client file /data/out.txt --work-units 16")  # fmt: skip
    spec = harness.spec().model_copy(update={"entrypoint": ["sh", "-c", script], "cmd": []})
    desired = harness.assign(spec)
    status = wait_for(runtime, desired, FINISHED)
    logs = "\n".join(runtime.logs(tail=50))
    assert status.state == TaskState.COMPLETED, (status, logs)
    [queued] = harness.bridge.files.pending_upload()
    assert queued.path == harness.data_dir(desired) / "out.txt" and queued.work_units == 16
    # and `python3` as the command itself: the workload modules import under the process runtime
    program = "import workloads.bridge_client; print('imported')"
    check = harness.spec().model_copy(update={"entrypoint": ["python3", "-c", program], "cmd": []})
    status = wait_for(runtime, harness.assign(check), FINISHED)
    assert status.state == TaskState.COMPLETED and "imported" in "\n".join(runtime.logs(tail=5)), status
