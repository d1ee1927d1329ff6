"""`intellect devnet fire`: the whole protocol under fire, in one run anyone can start.

On namespaced hosts (devnet/hosts.py): the chain, discovery, the orchestrator, three validators with a
2-of-3 quorum, the trainer and the broadcast (origin + relay); two pipeline groups (2 and 3 members)
over links held 50 ms one way; single-node workers, one a contributor behind NAT; and one cheater of
every kind the protocol claims to catch, each on its own node:

| cheat | node | what should catch it |
|---|---|---|
| perturbed model | single | the validators' recomputation (TOPLOC), slashed by the quorum |
| inflated work units | single | the work-units rule, slashed |
| framing member | group | the group's seals and stage blame: the framer slashed, its partners not |
| wrong hardware answer | single | the orchestrator's hardware challenge: never invited |
| withholds its file | single | the availability rule: the file is missing past its deadline, slashed |
| submits another's file | single | the duplicate rule, slashed |

Faults come at times drawn from `--seed` and printed before they happen (`FaultPlan`). The run ends
when the trainer has taken its steps and every cheater is slashed or refused (or on timeout); then the
report (devnet/fire_report.py) says, per node, what it did and what it got, and whether the promise
held: every cheater lost stake or was refused, no honest node did, every paid token traced.

The roster is fixed so a report reads the same on every machine; `--short` keeps every cheater kind and
fewer steps and faults (what CI runs).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from devnet import demo
from devnet.network import DevnetError, chain_up
from devnet.placement import Placement
from devnet.processes import restart
from devnet.services import WorkerSpec, start_core, start_workers
from devnet.state import DevnetState

Progress = Callable[[str], None]
GROUP_SIZES = (2, 3)
TOPOLOGIES = [f"{n}x0GB" for n in GROUP_SIZES]
LINK_DELAY = 0.05  # seconds, one way, every hop of a group's ring
EJECT_AFTER_SECONDS = 60  # the orchestrator ejects a node silent this long (a day's default is 120 s)
# The reward lock and the vote window: 3 minutes, so the first honest rewards mature within a short run
# and the audit has payouts to trace (the demo's 5; a withheld file is judged a third of it after its
# submission: 60 s).
LOCK_SECONDS = 180
FRAME_CHEAT = "frame"  # noise where it forwards, forged tokens at the last stage (workloads/pipeline)
MEMBER_OF_3 = "a member of the group of 3"  # which one is drawn when the cut comes: groups re-form


@dataclass(frozen=True)
class Role:
    """One worker of the run: `index` (its keys are provider-/node-<index>), where it works (a group, or
    single), what it cheats at (None: honest), whether it sits behind the home router."""

    index: int
    place: str  # "group" | "single"
    cheat: str | None = None
    nat: bool = False
    cut: bool = False  # the worker whose host is cut until it is ejected, then healed (full form)

    @property
    def name(self) -> str:
        return f"worker-{self.index}"

    @property
    def host(self) -> str:
        return f"w{self.index}"

    def label(self) -> str:
        what = f"cheater: {self.cheat}" if self.cheat else "honest"
        where = "group member" if self.place == "group" else "single node"
        return f"{where}, {what}" + (", behind NAT" if self.nat else "") + (", host cut" if self.cut else "")


# Group members first (started alone, so the orchestrator's two groups are made of them); the framer is
# one of them. Then the single nodes, the contributor behind NAT among them.
ROSTER = (
    Role(1, "group"), Role(2, "group"), Role(3, "group"), Role(4, "group"), Role(5, "group", "frame"),
    Role(6, "single"), Role(7, "single", nat=True), Role(8, "single", cut=True),
    Role(9, "single", "perturbed-model"), Role(10, "single", "inflated-units"),
    Role(11, "single", "withhold"), Role(12, "single", "copy"), Role(13, "single", "hardware"),
)  # fmt: skip
CHEAT_KINDS = tuple(r.cheat for r in ROSTER if r.cheat)


@dataclass
class Fault:
    """One fault of the run: `kind`, its target, `at` seconds after the trainer's first step, and for
    how long (cuts); what happened is filled in as it runs."""

    kind: str  # links-cut | kill-validator | kill-orchestrator | host-cut | kill-relay
    target: str
    at: float
    hold: float = 0.0
    started: float | None = None
    ended: float | None = None
    outcome: str = "pending"

    def describe(self) -> str:
        held = f" for {self.hold:.0f} s" if self.hold else ""
        return f"t+{self.at:.0f} s: {self.kind} {self.target}{held}"


@dataclass
class FirePlan:
    seed: int = 1
    short: bool = False
    steps: int = 0  # 0: 4 short, 30 full
    timeout: float = 3600.0

    @property
    def trainer_steps(self) -> int:
        return self.steps or (4 if self.short else 30)

    def roster(self) -> list[Role]:
        """Every cheater kind in both forms; the short form drops the worker whose host is cut."""
        return [r for r in ROSTER if not (self.short and r.cut)]

    def faults(self) -> list[Fault]:
        """The faults at times drawn from the seed, in order, at least 20 s apart: a group member's links
        cut (15 s short, 30 s full), a validator and the orchestrator killed -9 and restarted, the relay
        killed; the full form also cuts a single node's host until it is ejected."""
        rng = random.Random(self.seed)
        kinds: list[tuple[str, str, float]] = [
            ("links-cut", MEMBER_OF_3, 15.0 if self.short else 30.0),
            ("kill-validator", f"validator-{rng.choice((2, 3))}", 0.0),
            ("kill-orchestrator", "orchestrator", 0.0),
            ("kill-relay", "broadcast-relay", 0.0),
        ]
        if not self.short:  # ejected after EJECT_AFTER_SECONDS of silence, then back
            kinds.append(("host-cut", next(r.host for r in ROSTER if r.cut), 0.0))
        rng.shuffle(kinds)
        window = 60.0 if self.short else 240.0
        times = sorted(rng.uniform(5.0, window) for _ in kinds)
        for i in range(1, len(times)):
            times[i] = max(times[i], times[i - 1] + 20.0)
        return [Fault(kind, target, round(at, 1), hold)
                for (kind, target, hold), at in zip(kinds, times, strict=True)]


@dataclass
class FireRun:
    """What the run leaves for the report: the devnet's state, who is who, the faults as they went, the
    stakes before any file was judged, and the times."""

    state: DevnetState
    plan: FirePlan
    roster: list[Role]
    faults: list[Fault]
    stakes_before: dict[int, int] = field(default_factory=dict)
    groups: list[dict[str, Any]] = field(default_factory=list)
    task_ids: list[str] = field(default_factory=list)
    first_step_at: float | None = None
    ended_at: float = 0.0
    began_at: float = field(default_factory=time.time)
    timed_out: bool = False

    def faults_json(self) -> list[dict[str, Any]]:
        return [asdict(f) for f in self.faults]


def start(directory: Path, plan: FirePlan, progress: Progress) -> FireRun:
    """The chain and services on hosts, the learning side, the group members and their tasks, then the
    single nodes and theirs; returns once every task is posted."""
    state, where = chain_up(directory, None, progress, hosts=True)
    roster = plan.roster()
    run = FireRun(state, plan, roster, plan.faults())
    start_core(state, where, progress, TOPOLOGIES,
               orchestrator_env={"INTELLECT_ORCH_EJECT_AFTER_SECONDS": str(EJECT_AFTER_SECONDS)})  # fmt: skip
    single = demo.DemoPlan(steps=plan.trainer_steps, files_per_step=1, timeout=plan.timeout, cheat="none")
    progress("recording the validators and the 2-of-3 slashing quorum on chain")
    demo.configure_chain(state, single, lock=LOCK_SECONDS, window=LOCK_SECONDS)
    learning = demo.start_learning_services(state, single, "process", progress)
    trainer, broadcast, validators, task_file = learning
    state.processes.extend([trainer, *broadcast, *validators])
    state.save()
    where = Placement.of(state)  # the hosts the learning side added: a new host takes the next address
    spec = json.loads(task_file.read_text())
    step_url = spec["workload"]["settings"]["step_url"]
    relays = spec["workload"]["settings"]["checkpoint_source"].removeprefix("broadcast:").split(",")

    members = [r for r in roster if r.place == "group"]
    start_workers(state, where, {r.index: worker_spec(r) for r in members}, progress)
    # each provider staked when its worker registered: read before any of its files can be judged
    run.stakes_before |= {r.index: demo.provider_stake(state, r.index) for r in members}
    for size in GROUP_SIZES:
        group_plan = demo.DemoPlan(steps=plan.trainer_steps, pipeline=size, in_flight=4, files_per_step=1)
        group_spec = demo.pipeline_task_spec(group_plan, step_url.removesuffix("/step"), "process", relays)
        group_spec["scheduling_config"]["plugins"]["node_groups"]["max_groups"] = 1
        run.task_ids.append(post(state, group_spec))
    progress("waiting for the orchestrator to form a group of 2 and a group of 3")
    run.groups = wait_for_groups(state, len(GROUP_SIZES), timeout=300)

    singles = [r for r in roster if r.place == "single"]
    start_workers(state, where, {r.index: worker_spec(r, directory.resolve()) for r in singles}, progress)
    run.stakes_before |= {r.index: demo.provider_stake(state, r.index) for r in singles}
    run.task_ids.append(post(state, spec))
    where.save(state)
    return run


def worker_spec(role: Role, directory: Path | None = None) -> WorkerSpec:
    """How `role`'s worker runs: a cheat in its tasks (the operator's environment), a cheating client
    (devnet/cheaters.py), or neither. The copier copies from the first honest single node's files (in
    `directory`, the devnet's: on hosts the uploads live on the storage host, not on a disk it reads)."""
    task_env: dict[str, str] = {"OMP_NUM_THREADS": "1"}
    program = None
    extra: dict[str, str] = {}
    if role.cheat == "copy" and directory is not None:
        source = next(r for r in ROSTER if r.place == "single" and not r.cheat)
        extra["INTELLECT_CHEAT_COPY_FROM"] = str(directory / f"worker-{source.index}" / "data")
    if role.cheat in ("perturbed-model", "inflated-units"):
        task_env["INTELLECT_INFER_CHEAT"] = role.cheat
    elif role.cheat == "frame":
        task_env["INTELLECT_PIPELINE_CHEAT"] = FRAME_CHEAT
    elif role.cheat is not None:
        program = role.cheat
    env = ({"INTELLECT_WORKER_TASK_ENV": json.dumps(task_env)} if len(task_env) > 1 else {}) | extra
    return WorkerSpec(env=env, nat=role.nat, p2p=role.place == "group",
                      link_delay=LINK_DELAY if role.place == "group" else 0.0, program=program)  # fmt: skip


def _admin(state: DevnetState) -> tuple[str, dict[str, str]]:
    orchestrator = state.process("orchestrator")
    if orchestrator is None or orchestrator.url is None:
        raise DevnetError("the devnet has no orchestrator")
    token = (Path(state.directory) / "orchestrator" / "admin-token").read_text().strip()
    return orchestrator.url, {"Authorization": f"Bearer {token}"}


def post(state: DevnetState, spec: dict[str, Any]) -> str:
    """Post a task as a trainer would, with the Python SDK."""
    with demo.admin_client(state) as client:
        return client.submit(spec).id


def groups_now(state: DevnetState) -> list[dict[str, Any]]:
    url, headers = _admin(state)
    try:
        reply = httpx.get(f"{url}/groups", headers=headers, timeout=10)
        return list(reply.json().get("groups", [])) if reply.status_code == 200 else []
    except (httpx.HTTPError, ValueError):
        return []


def wait_for_groups(state: DevnetState, count: int, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        groups = [g for g in groups_now(state) if g.get("task_id")]
        if len(groups) >= count:
            return groups
        time.sleep(2)
    raise DevnetError(f"the orchestrator formed fewer than {count} groups in {timeout:.0f} s "
                      f"(see {Path(state.directory) / 'orchestrator.log'})")  # fmt: skip


class FaultRunner(threading.Thread):
    """Runs the plan's faults at their times after the trainer's first step (`begin`), one after
    another; each records when it ran and what it saw. Errors are recorded, never raised: the report
    says which fault did not happen as planned."""

    def __init__(self, run: FireRun, progress: Progress) -> None:
        super().__init__(daemon=True, name="faults")
        self.run_ = run
        self.progress = progress
        self.begun = threading.Event()
        self.stop_now = threading.Event()
        self.t0 = 0.0

    def begin(self) -> None:
        self.t0 = time.monotonic()
        self.begun.set()

    def run(self) -> None:
        self.begun.wait()
        for fault in self.run_.faults:
            if self.stop_now.wait(max(0.0, self.t0 + fault.at - time.monotonic())):
                return
            fault.started = time.time()
            self.progress(f"fault: {fault.describe()}")
            try:
                fault.outcome = self.apply(fault)
            except Exception as exc:  # recorded for the report
                fault.outcome = f"failed: {exc}"
            fault.ended = time.time()
            self.progress(f"fault done: {fault.kind} {fault.target}: {fault.outcome}")

    def apply(self, fault: Fault) -> str:
        state = DevnetState.load(Path(self.run_.state.directory)) or self.run_.state
        world = Placement.of(state).world
        if fault.kind in ("kill-validator", "kill-orchestrator"):
            began = time.monotonic()
            new = restart(state, fault.target, kill=True, timeout=300)
            return f"SIGKILL, restarted as pid {new.pid}, answering after {time.monotonic() - began:.0f} s"
        if fault.kind == "kill-relay":
            proc = state.process(fault.target)
            if proc is None or not proc.kill():
                return "the relay was not running"
            return "SIGKILL (left down: workers fetch checkpoints from the origin)"
        if world is None:
            return "no hosts to cut"
        if fault.kind == "links-cut":
            host, peers = group_of_3(self.run_, state)
            for peer in peers:
                world.partition(host, peer)
            time.sleep(fault.hold)
            for peer in peers:
                world.heal(host, peer)
            return f"{host} cut from {', '.join(peers) or 'no peer'} for {fault.hold:.0f} s, healed"
        if fault.kind == "host-cut":
            return self.cut_until_ejected(state, fault.target)
        return f"unknown fault {fault.kind}"

    def cut_until_ejected(self, state: DevnetState, host: str) -> str:
        """Cut `host` from every other host until the chain shows its node out of the pool, then heal."""
        from ledger.client import LedgerClient

        world = Placement.of(state).world
        assert world is not None
        others = [h for h in world.hosts if h != host and world.hosts[h].home is None]
        for other in others:
            world.partition(host, other)
        node = state.account("node-" + host.removeprefix("w")).address
        ledger = LedgerClient(state.rpc_url, Path(state.deployment_path), check=False)
        began = time.monotonic()
        deadline = began + EJECT_AFTER_SECONDS + 180
        ejected = False
        while time.monotonic() < deadline and not self.stop_now.is_set():
            if not ledger.is_node_in_pool(state.pool_id, node):
                ejected = True
                break
            time.sleep(3)
        for other in others:
            world.heal(host, other)
        held = time.monotonic() - began
        return (f"cut for {held:.0f} s, ejected, healed" if ejected
                else f"cut for {held:.0f} s, never ejected, healed")  # fmt: skip


def group_of_3(run: FireRun, state: DevnetState, wait: float = 90.0) -> tuple[str, list[str]]:
    """An honest member of a group as the groups are now, drawn with the run's seed, and its partners'
    hosts: of the group of 3 if one stands within `wait` seconds (a group whose framer was slashed
    re-forms), else of any group of 2 or more; none: the first honest member and no partner."""
    by_address = {state.account(f"node-{r.index}").address.lower(): r for r in run.roster}
    deadline = time.monotonic() + wait
    while True:
        standing = []
        for group in groups_now(state):
            members = [by_address[a.lower()] for a in group.get("nodes", []) if a.lower() in by_address]
            if len(members) >= 2 and any(not m.cheat for m in members):
                standing.append(members)
        threes = [g for g in standing if len(g) == 3]
        if threes or (standing and time.monotonic() > deadline):
            members = (threes or standing)[0]
            honest = sorted((m for m in members if not m.cheat), key=lambda m: m.index)
            chosen = random.Random(run.plan.seed).choice(honest)
            return chosen.host, [m.host for m in members if m is not chosen]
        if time.monotonic() > deadline:
            first = next(r for r in run.roster if r.place == "group" and not r.cheat)
            return first.host, []
        time.sleep(3)
