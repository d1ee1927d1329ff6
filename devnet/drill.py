"""Fault drill: kill -9 each devnet service in turn, start it again, and measure what came back.

Before the first fault the drill makes sure there is work in flight: a task (the scriptable test
workload) that every worker runs, each worker's rollout file uploaded and recorded on chain with
`submitWork`, and the task still running. It then notes what must survive (a Snapshot) and, per
service, SIGKILLs it, restarts it exactly as `up` did (devnet/processes.py) and waits until the
network is back to that snapshot. "Lost" is anything of the snapshot missing at the timeout; the
seconds are from the kill until everything is back.

What a snapshot holds, and why each is a loss if it changes:
- the tasks the orchestrator lists (an accepted task must outlive any restart);
- the Healthy nodes and the task each reports (workers re-attach without being restarted, and keep
  their assignment);
- the pool's on-chain work records (no upload or queued submission lost, none submitted twice) and
  the chain height (anvil resumes from its state dumped every second: see ledger/dev/anvil.py);
- the task supervisors per worker (a killed worker's restart adopts its task: not duplicated, not
  orphaned).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

import psutil

from devnet.processes import restart
from devnet.state import DevnetState
from intellect.client import OrchestratorClient
from ledger.client import LedgerClient

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SERVICES = ("redis", "orchestrator", "discovery", "worker-1", "anvil")
CHAIN_DUMP_SECONDS = 1.0
"""anvil writes its state every second (`--state-interval 1`): the drill lets that window pass before
killing it, and a kill inside it can lose at most the last second of blocks."""

Progress = Callable[[str], None]


class DrillError(Exception):
    """The drill could not set up its baseline; the message says what to fix."""


@dataclass(frozen=True)
class Snapshot:
    tasks: frozenset[str]
    healthy: frozenset[str]
    assigned: tuple[tuple[str, str], ...]  # (node, task id) per Healthy node reporting a task
    work_records: int
    block: int
    supervisors: tuple[tuple[str, int], ...]  # (worker name, task supervisors running)
    beats: tuple[tuple[str, float], ...] = ()  # (node, unix time of its last heartbeat)

    def missing_from(self, now: Snapshot | None, since: float = 0.0) -> list[str]:
        """What of this snapshot `now` lacks (empty: recovered); every node that was Healthy must
        also have sent a heartbeat after `since` (the kill), i.e. really re-attached."""
        if now is None:
            return ["the orchestrator or the chain does not answer"]
        gaps = [f"task {t} gone" for t in sorted(self.tasks - now.tasks)]
        gaps += [f"node {n[:10]}… not Healthy" for n in sorted(self.healthy - now.healthy)]
        beat = dict(now.beats)
        gaps += [f"no heartbeat from {n[:10]}… since the fault" for n in sorted(self.healthy)
                 if beat.get(n, 0.0) <= since]  # fmt: skip
        was, got = dict(self.assigned), dict(now.assigned)
        gaps += [f"node {n[:10]}… reports {got.get(n)} instead of {t}"
                 for n, t in was.items() if got.get(n) != t]  # fmt: skip
        if now.work_records != self.work_records:
            gaps.append(f"{now.work_records} work records on chain, {self.work_records} before")
        if now.block < self.block:
            gaps.append(f"chain at block {now.block}, {self.block} before")
        sup_was, sup_now = dict(self.supervisors), dict(now.supervisors)
        gaps += [f"{w}: {sup_now.get(w, 0)} task supervisors, {n} before" for w, n in sup_was.items()
                 if sup_now.get(w, 0) != n]  # fmt: skip
        return gaps


@dataclass
class FaultResult:
    service: str
    killed_pid: int
    new_pid: int
    answering_seconds: float  # kill → the restarted process answers its health check
    recovered_seconds: float | None  # kill → the whole snapshot is back (None: not within the timeout)
    lost: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Drill:
    """One devnet's drill: the baseline, then one fault at a time."""

    def __init__(self, state: DevnetState, progress: Progress = print) -> None:
        self.state = state
        self.progress = progress
        orchestrator = state.process("orchestrator")
        if orchestrator is None or not orchestrator.url:
            raise DrillError("this devnet has no orchestrator: `intellect devnet up` first")
        token_file = Path(state.directory) / "orchestrator" / "admin-token"
        if not token_file.exists():
            raise DrillError(f"no admin token at {token_file}: is the orchestrator of this devnet running?")
        self.api = OrchestratorClient(orchestrator.url, token=token_file.read_text(), timeout=5, retries=1)
        self.chain = LedgerClient(state.rpc_url, Path(state.deployment_path), check=False)
        self.workers = [p.name for p in state.processes if p.name.startswith("worker-")]
        if not self.workers:
            raise DrillError("this devnet has no workers: `intellect devnet up --workers 2`")

    def close(self) -> None:
        self.api.close()

    # ---- what must survive ----------------------------------------------------------------------
    def snapshot(self) -> Snapshot | None:
        try:
            tasks = frozenset(t.id for t in self.api.list())
            nodes = self.api.nodes().nodes
            work = self.chain.file_count(self.state.pool_id)
            block = self.chain.w3.eth.block_number
        except Exception:  # a service is down: not recovered yet
            return None
        healthy = frozenset(n.address for n in nodes if n.state.value == "Healthy")
        assigned = tuple(sorted((n.address, n.task.task_id) for n in nodes
                                if n.address in healthy and n.task is not None))  # fmt: skip
        beats = tuple(sorted((n.address, n.last_heartbeat_at.replace(tzinfo=UTC).timestamp())
                             for n in nodes if n.last_heartbeat_at is not None))  # fmt: skip
        return Snapshot(tasks, healthy, assigned, work, block, tuple(self.supervisors().items()), beats)

    def supervisors(self) -> dict[str, int]:
        """Task supervisors (worker/runtime/supervise.py) alive per worker, told apart by state dir."""
        counts = dict.fromkeys(self.workers, 0)
        for proc in psutil.process_iter(["cmdline", "status"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            if "supervise.py" not in cmd or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            for worker in self.workers:
                if f"{Path(self.state.directory) / worker}/" in cmd:
                    counts[worker] += 1
        return counts

    # ---- the baseline ----------------------------------------------------------------------------
    def baseline(self, timeout: float = 180.0) -> Snapshot:
        """Post the drill task unless one runs, and wait until every worker is Healthy, runs it and
        has its file on chain; returns the snapshot every fault must come back to."""
        nodes = [self.state.account(f"node-{w.split('-')[1]}").address for w in self.workers]
        task_id = next((t.id for t in self.api.list() if t.spec.name == "fault-drill"), None)
        want_work = 0  # an earlier drill's task: its files are on chain already
        if task_id is None:
            self.progress("posting the drill task")
            want_work = self.chain.file_count(self.state.pool_id)
            task_id = self.api.submit(drill_task()).id
        deadline = time.monotonic() + timeout
        while True:
            snap = self.snapshot()
            if snap is not None:
                running = {n for n, t in snap.assigned if t == task_id}
                files = self.chain.file_count(self.state.pool_id) - want_work
                one_each = all(count == 1 for _, count in snap.supervisors)
                if running >= set(nodes) and files >= len(nodes) and one_each:
                    break
            if time.monotonic() > deadline:
                raise DrillError(f"the drill task did not run and submit on every worker in {timeout:.0f}s "
                                 f"(last seen: {snap}); see the worker logs in {self.state.directory}")
            time.sleep(1)
        time.sleep(CHAIN_DUMP_SECONDS * 1.5)  # let anvil's state dump cover the submissions
        settled = self.snapshot()
        if settled is None:
            raise DrillError("the devnet stopped answering while the drill set up")
        return settled

    # ---- one fault -------------------------------------------------------------------------------
    def fault(self, service: str, before: Snapshot, timeout: float = 180.0) -> FaultResult:
        old = self.state.process(service)
        killed_pid = old.pid if old is not None else 0
        self.progress(f"kill -9 {service} (pid {killed_pid})")
        started, killed_at = time.monotonic(), time.time()
        new = restart(self.state, service, kill=True, timeout=timeout)  # RestartError names the known ones
        answering = time.monotonic() - started
        deadline = started + timeout
        gaps: list[str] = []
        while time.monotonic() < deadline:
            gaps = before.missing_from(self.snapshot(), since=killed_at)
            if not gaps:
                recovered = time.monotonic() - started
                self.progress(f"{service}: answering after {answering:.1f}s, all back after {recovered:.1f}s")
                if service == "anvil":
                    time.sleep(CHAIN_DUMP_SECONDS * 1.5)
                return FaultResult(service, killed_pid, new.pid, round(answering, 2), round(recovered, 2))
            time.sleep(0.5)
        return FaultResult(service, killed_pid, new.pid, round(answering, 2), None, gaps)


def drill_task() -> dict[str, Any]:
    """Every worker writes a file unique to its node, announces it (upload + submitWork), then runs on."""
    actions = ["write:rollouts.bin:drill-${NODE_ADDRESS}-${TASK_ID}", "announce:rollouts.bin:3",
               "print:submitted", "sleep:86400"]  # fmt: skip
    return {
        "name": "fault-drill",
        "image": "intellect-test:latest",
        "entrypoint": [sys.executable, str(REPO / "images" / "test" / "workload.py")],
        "cmd": actions,
        "env_vars": {"PYTHONPATH": str(REPO)},
        "storage_config": {
            "file_name_template": "drill/${NODE_ADDRESS}/${CURRENT_FILE_INDEX}-${ORIGINAL_NAME}"
        },
    }


def run_drill(
    state: DevnetState, services: list[str], timeout: float = 180.0, progress: Progress = print
) -> list[FaultResult]:
    drill = Drill(state, progress)
    try:
        before = drill.baseline(timeout)
        results = []
        for service in services:
            result = drill.fault(service, before, timeout)
            results.append(result)
            if result.recovered_seconds is None:
                break  # the next fault would be measured on a broken network
        return results
    finally:
        drill.close()
