"""`intellect devnet up --demo`: a whole decentralized RL run on this machine, with nobody acting.

On top of the devnet's chain, Redis, discovery and orchestrator it starts the trainer (step counter
and checkpoints), validators with a slashing quorum recorded on chain, and workers, one of which is
run by a cheater (its operator injects `INTELLECT_INFER_CHEAT` into every task it runs, as a
dishonest contributor would). Then it posts the RL task with the Python SDK and watches:

- workers generate rollouts for the trainer's step with the newest usable checkpoint, upload them
  and record them on chain (`submitWork`);
- validators judge every file; the cheater's forged rewards are voted invalid by the quorum, which
  slashes its provider's stake and ejects the node;
- the trainer learns only from files the validators accepted, so the reward rises step by step;
- with the demo's short reward lock, the honest workers' rewards become claimable.

The watch ends when the trainer reaches `steps` and the cheater is ejected (or on timeout), and
writes the reward curve as CSV and PNG under `<dir>/demo/`.
"""

from __future__ import annotations

import csv
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from devnet.hosts import Host
from devnet.placement import Placement
from devnet.processes import BIN, base_env, spawn, wait_healthy
from devnet.state import DevnetState, ManagedProcess
from intellect.client import OrchestratorClient
from intellect.identity import Wallet
from intellect.net import stable_port
from ledger.client import LedgerClient
from ledger.models import ONE_TOKEN

Progress = Callable[[str], None]
REPO = Path(__file__).resolve().parents[1]
VLLM_IMAGE = "intellect-workload-vllm:latest"  # the inference workload with vLLM (`make images-vllm`)
CHEATS = ("forged-reward", "perturbed-model", "inflated-units")
# What the cheating member of a pipeline group does, at whichever stage the orchestrator gives it
# (workloads/pipeline/member.py): perturbed weights on one matrix of its layers, its layers skipped,
# noise on (or another prompt's) activations it forwards (not at the last stage), greedy tokens
# instead of the seed's draw (only at the last stage).
PIPELINE_CHEATS = ("weights", "skip", "noise", "other-prompt", "forge-token")
VALIDATOR_ROLES = ("validator", "validator-2", "validator-3")
# Short on purpose: rewards of honest work mature within the demo, and the cheater's files are
# still inside the invalidation window when the quorum votes (the defaults are a day).
# The contract keeps the lock at least as long as the window in which validators may invalidate: no
# reward unlocks before its work could be judged. Five minutes: three validators on 2 cores judge a
# file within seconds to a minute, and early work becomes claimable within the demo.
DEMO_REWARD_LOCK_SECONDS = 300
DEMO_INVALIDATION_WINDOW_SECONDS = 300
DEMO_SLASH_TOKENS = 50
# A process of the run found dead counts as exited only after this long: `devnet restart` stops it
# (SIGTERM, up to 10 s) before it saves the new one, which the watch then follows.
RESTART_GRACE = 30.0


class DemoError(RuntimeError):
    """The demo could not be set up or did not reach its goal; the message says which part. `report`:
    what the run had reached when it failed (printed, so a failure still shows its table)."""

    def __init__(self, message: str, report: DemoReport | None = None) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class DemoPlan:
    steps: int = 40
    validators: int = 3
    quorum: int = 2
    cheat: str = "forged-reward"
    timeout: float = 3600.0
    batch_size: int = 16
    n: int = 4
    max_new_tokens: int = 16
    files_per_step: int = 3
    pipeline: int = 0  # members per node group (2 or 3): rollouts made by groups, one stage each
    in_flight: int = 1  # batches a group keeps moving at once (over delayed links: 4)
    trainer_ranks: int = 1  # processes the trainer shards its policy over (intellect-train --nproc)
    backend: str = "torch"  # the engine the workers generate with: torch | vllm (its own install, issue 57)

    def check(self) -> None:
        if not 1 <= self.validators <= len(VALIDATOR_ROLES):
            raise DemoError(f"--validators must be 1..{len(VALIDATOR_ROLES)}")
        if not 1 <= self.quorum <= self.validators:
            raise DemoError(f"--quorum must be 1..{self.validators} (the number of validators)")
        cheats = PIPELINE_CHEATS if self.pipeline else CHEATS
        if self.cheat not in (*cheats, "none"):
            what = "a pipeline group's member" if self.pipeline else "a worker"
            raise DemoError(f"--cheat {self.cheat!r} for {what}: use one of {', '.join(cheats)} or none")
        if self.pipeline not in (0, 2, 3):
            raise DemoError("--pipeline must be 2 or 3 (members per group; the tiny model has 4 layers)")
        if self.steps < 1:
            raise DemoError("--steps must be at least 1")
        if self.backend not in ("torch", "vllm"):
            raise DemoError(f"--backend {self.backend!r}: use torch or vllm")
        if self.backend == "vllm" and self.pipeline:
            raise DemoError("--backend vllm makes single-node rollouts: node groups run the torch stages")
        if not 1 <= self.trainer_ranks <= 8:
            raise DemoError("--trainer-ranks must be 1..8 (processes of the trainer on this machine)")

    @property
    def topology(self) -> str:
        return f"{self.pipeline}x0GB"

    def cheat_env(self) -> dict[str, str]:
        """What the cheating operator injects into every task its worker runs."""
        if self.cheat == "none":
            return {}
        return {"INTELLECT_PIPELINE_CHEAT" if self.pipeline else "INTELLECT_INFER_CHEAT": self.cheat}


@dataclass
class DemoReport:
    steps: int = 0
    curve: list[float] = field(default_factory=list)
    cheater: str = ""
    cheater_ejected: bool = False
    cheater_stake_before: int = 0
    cheater_stake_after: int = 0
    slash_votes: list[dict[str, Any]] = field(default_factory=list)
    # What must stay empty (a protocol promise, not a demo detail): honest files voted invalid, and
    # honest nodes out of the pool at the end, each with the orchestrator's recorded reason.
    honest_invalidations: list[dict[str, Any]] = field(default_factory=list)
    honest_out_of_pool: dict[str, str] = field(default_factory=dict)
    files_judged: int = 0
    files_accepted: int = 0
    tokens_generated: int = 0
    claimable: dict[str, int] = field(default_factory=dict)
    pending: dict[str, int] = field(default_factory=dict)  # rewards still inside the lock
    # Each node's latest hardware challenge as the orchestrator recorded it (docs/hardware.md): what
    # placement went by, proven, never claimed.
    hardware: dict[str, dict[str, Any]] = field(default_factory=dict)
    wall_seconds: float = 0.0  # the watch: from the task posted to the end of the run
    startup_seconds: float = 0.0  # before it: the chain, the services, the workers joined, the task posted
    steps_seconds: float = 0.0  # from the task posted to the trainer's last step
    curve_csv: str = ""
    curve_png: str = ""
    dashboard_url: str = ""

    @property
    def rise(self) -> float:
        k = min(5, len(self.curve) // 2)
        if k == 0:
            return 0.0
        return sum(self.curve[-k:]) / k - sum(self.curve[:k]) / k

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "reward_rise_first5_to_last5": self.rise}


def backend_worker_env(plan: DemoPlan, workers: int) -> dict[int, dict[str, str]]:
    """What every worker needs for the plan's backend: with vLLM, its environment (`make vllm`), which
    the task's entry point names, readable by the worker's confined tasks."""
    if plan.backend != "vllm":
        return {}
    from workloads.model.vllm_backend import vllm_python

    software = json.dumps([str(Path(vllm_python()).parent.parent)])
    return {i: {"INTELLECT_WORKER_TASK_SOFTWARE": software} for i in range(1, workers + 1)}


def task_spec(plan: DemoPlan, trainer_url: str, runtime: str, relays: list[str]) -> dict[str, Any]:
    """The RL rollout task every worker runs: follow the trainer's step counter, fetch its checkpoints
    from the broadcast relays, write TOPLOC-proved rollout files that the worker uploads and records
    on chain."""
    if plan.pipeline:
        return pipeline_task_spec(plan, trainer_url, runtime, relays)
    in_container = runtime == "docker"
    # What the validators judge by: the workload plug-in checks these when the task is POSTed and
    # passes them to the program as its INTELLECT_INFER_* env vars.
    settings: dict[str, Any] = {
        "dataset": "reverse",
        "batch_size": plan.batch_size,
        "n": plan.n,
        "max_new_tokens": plan.max_new_tokens,
        "step_url": f"{trainer_url}/step",
        "checkpoint_source": "broadcast:" + ",".join(relays),
        "poll_seconds": 0.5,
        # Three files of 64 rows per worker and step: enough informative groups for a step, and no
        # more than three validators on a 2-core machine can judge before the files go stale.
        "files_per_step": plan.files_per_step,
        "step_patience_seconds": 20,
    }
    env = {
        "INTELLECT_INFER_NODE_ADDRESS": "${NODE_ADDRESS}",
        # Four workers, three validators and a trainer share this machine's cores: one thread each
        # avoids the oversubscription that would slow every process down.
        "OMP_NUM_THREADS": "1",
    }
    if not in_container:
        env["PYTHONPATH"] = str(REPO)
    python, image = "python3" if in_container else sys.executable, "intellect-workload:latest"
    if plan.backend == "vllm":  # vLLM's engine in its own environment (`make vllm`) or image
        from workloads.model.vllm_backend import vllm_python

        settings["backend"] = "vllm"
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"  # OMP_NUM_THREADS=1 as the others, not bound to all
        python, image = ("python3", VLLM_IMAGE) if in_container else (vllm_python(), image)
    return {
        "name": "demo-rl-reverse",
        "image": image,
        "workload": {"type": "inference", "settings": settings},
        "entrypoint": [python, "-m", "workloads.inference"],
        "env_vars": env,
    }


def pipeline_task_spec(plan: DemoPlan, trainer_url: str, runtime: str, relays: list[str]) -> dict[str, Any]:
    """The same RL run with the rollouts made by node groups: each member of a `pipeline`-member group
    holds its stage of the trainer's checkpoint, the driver follows the trainer's step, every member
    uploads its copy of each batch (the rollout schema's fields, and every stage's proofs)."""
    in_container = runtime == "docker"
    settings: dict[str, Any] = {
        "dataset": "reverse", "batch_size": plan.batch_size, "n": plan.n,
        "max_new_tokens": plan.max_new_tokens, "batches": 100_000, "target_lengths": [8],
        "length_penalty": 0.0003, "step_url": f"{trainer_url}/step",
        "checkpoint_source": "broadcast:" + ",".join(relays), "poll_seconds": 0.5,
        "files_per_step": plan.files_per_step, "step_patience_seconds": 20, "timeout_seconds": 120,
        "in_flight": plan.in_flight,
    }  # fmt: skip
    env = {"OMP_NUM_THREADS": "1"}
    if not in_container:
        env["PYTHONPATH"] = str(REPO)
    return {
        "name": f"demo-rl-reverse-pipeline-{plan.pipeline}",
        "image": "intellect-workload:latest",
        "workload": {"type": "pipeline", "settings": settings},
        "entrypoint": ["python3" if in_container else sys.executable, "-m", "workloads.pipeline", "task"],
        "env_vars": env,
        "scheduling_config": {"plugins": {"node_groups": {"allowed_topologies": [plan.topology]}}},
        # every member's copy of a batch has the same name: the node's address keeps them apart
        "storage_config": {"file_name_template": "${TASK_ID}/${NODE_ADDRESS}/${ORIGINAL_NAME}"},
    }


def configure_chain(state: DevnetState, plan: DemoPlan, lock: int = DEMO_REWARD_LOCK_SECONDS,
                    window: int = DEMO_INVALIDATION_WINDOW_SECONDS) -> None:  # fmt: skip
    """Short reward lock and vote window, the pool's validators and its slashing quorum, all recorded
    on chain."""
    deployment = Path(state.deployment_path)
    admin = LedgerClient(state.rpc_url, deployment, Wallet.from_key(state.account("deployer").private_key))
    params = admin.work_parameters()
    admin.set_work_parameters(params.reward_per_unit, lock, window, params.slash_penalty)
    manager = admin.with_wallet(Wallet.from_key(state.account("pool-manager").private_key))
    for role in VALIDATOR_ROLES[: plan.validators]:
        manager.slashing.add_validator(state.pool_id, state.account(role).address)
    manager.slashing.set_policy(state.pool_id, plan.quorum, DEMO_SLASH_TOKENS * ONE_TOKEN, window)


def start_learning_services(
    state: DevnetState, plan: DemoPlan, runtime: str, progress: Progress
) -> tuple[ManagedProcess, list[ManagedProcess], list[ManagedProcess], Path]:
    """The trainer, the broadcast origin (publishing each new checkpoint) and a relay, and the
    validators; each needs the others' URLs, so ports are chosen first."""
    directory = Path(state.directory)
    env = base_env(directory) | {"OMP_NUM_THREADS": "1"}
    orchestrator = state.process("orchestrator")
    if orchestrator is None or orchestrator.url is None:
        raise DemoError("the devnet has no orchestrator running")
    # `up --hosts`: the trainer with its broadcast origin (which reads its checkpoints from disk) on one
    # host, the relay and each validator on hosts of their own
    where = Placement.of(state)
    names = ("trainer", "relay", *(f"v{i + 1}" for i in range(plan.validators)))
    at = {name: where.host(name) for name in names}
    trainer_port = stable_port()
    trainer_url = f"http://{where.address(at['trainer'])}:{trainer_port}"
    validator_ports = [stable_port() for _ in range(plan.validators)]
    validator_urls = [f"http://{where.address(at[f'v{i + 1}'])}:{p}" for i, p in enumerate(validator_ports)]
    origin_port, relay_port = stable_port(), stable_port()
    relays = [f"http://{where.address(at['relay'])}:{relay_port}",
              f"http://{where.address(at['trainer'])}:{origin_port}"]  # the origin as fallback  # fmt: skip
    spec = task_spec(plan, trainer_url, runtime, relays)
    task_file = directory / "demo" / "task.json"
    task_file.parent.mkdir(parents=True, exist_ok=True)
    task_file.write_text(json.dumps(spec, indent=2))

    progress("starting the trainer")
    trainer = spawn(
        "trainer",
        where.wrap(at["trainer"], [
            str(BIN / "intellect-train"), "--cpu-demo", "--host", where.bind(at["trainer"]),
            "--public-url", trainer_url, "--port", str(trainer_port), "--rollouts", validator_urls[0],
            "--pool-id", str(state.pool_id),
            "--output-dir", str(directory / "trainer"), "--max-steps", str(plan.steps),
            "--poll-seconds", "0.5", "--keep", "10", "--nproc", str(plan.trainer_ranks),
            # the checkpoints files may name stay served until those files' vote window has passed
            # (the validators judge the last steps' files after the trainer's last step)
            "--vote-window-seconds", str(DEMO_INVALIDATION_WINDOW_SECONDS)]),
        env | {"OMP_NUM_THREADS": "2"},
        directory,
        trainer_url,
    )  # fmt: skip
    wait_healthy(trainer, timeout=180)

    progress("starting the broadcast origin and a relay")
    broadcast = directory / "broadcast"
    origin = spawn(
        "broadcast-origin",
        where.wrap(at["trainer"], [
            str(BIN / "intellect-broadcast"), "origin", "--dir", str(broadcast / "origin"),
            "--host", where.bind(at["trainer"]), "--port", str(origin_port),
            "--watch", str(directory / "trainer"), "--shard-size", str(1 << 20)]),
        env, directory, relays[1],
    )  # fmt: skip
    wait_healthy(origin, timeout=60)
    relay = spawn(
        "broadcast-relay",
        where.wrap(at["relay"], [
            str(BIN / "intellect-broadcast"), "relay", "--upstream", relays[1],
            "--dir", str(broadcast / "relay-1"), "--host", where.bind(at["relay"]),
            "--port", str(relay_port)]),
        env, directory, relays[0],
    )  # fmt: skip
    wait_healthy(relay, timeout=60)

    validators = [start_validator(state, i, port, validator_urls[i], orchestrator.url, where,
                                  at[f"v{i + 1}"], f"{trainer_url}/step", progress)
                  for i, port in enumerate(validator_ports)]  # fmt: skip
    for v in validators:
        wait_healthy(v, timeout=180)
    where.save(state)
    return trainer, [origin, relay], validators, task_file


def start_validator(
    state: DevnetState, index: int, port: int, url: str, orchestrator_url: str, where: Placement,
    host: Host | None = None, step_url: str | None = None, progress: Progress = lambda msg: None,
) -> ManagedProcess:  # fmt: skip
    """`intellect-validator run` as the pool's validator number `index` (its role's key), voting; with
    `step_url` it follows a trainer (an RL run), without one it judges whatever tasks the pool runs."""
    role = VALIDATOR_ROLES[index]
    progress(f"starting {role}")
    argv = [str(BIN / "intellect-validator"), "run", "--pool", str(state.pool_id), "--host", where.bind(host),
            "--port", str(port), "--orchestrator-url", orchestrator_url,
            "--data-dir", str(Path(state.directory) / role)]  # fmt: skip
    if step_url:
        argv += ["--step-url", step_url]
    return spawn(role, where.wrap(host, argv), base_env(Path(state.directory)) | {
        "OMP_NUM_THREADS": "1",
        "INTELLECT_VALIDATOR_RPC_URL": state.rpc_url,
        "INTELLECT_VALIDATOR_DEPLOYMENT": state.deployment_path,
        "INTELLECT_VALIDATOR_KEY": state.key_ref(role),
        "INTELLECT_VALIDATOR_POLL_SECONDS": "0.5",
    }, Path(state.directory), url)  # fmt: skip


def admin_client(state: DevnetState) -> OrchestratorClient:
    """The Python SDK's client on the devnet's orchestrator, with its admin token."""
    token = (Path(state.directory) / "orchestrator" / "admin-token").read_text().strip()
    orchestrator = state.process("orchestrator")
    if orchestrator is None or orchestrator.url is None:
        raise DemoError("the devnet has no orchestrator running")
    return OrchestratorClient(orchestrator.url, token=token)


def provider_stake(state: DevnetState, worker: int, ledger: LedgerClient | None = None) -> int:
    """The stake of worker `worker`'s provider now (read before the task is posted: the cheater's
    stake before any slash)."""
    ledger = ledger or LedgerClient(state.rpc_url, Path(state.deployment_path), check=False)
    return int(ledger.get_provider(state.account(f"provider-{worker}").address).stake)


def submit(state: DevnetState, task_file: Path) -> str:
    """Post the RL task as a trainer would, with the Python SDK (admin token of the devnet)."""
    with admin_client(state) as client:
        return client.submit(json.loads(task_file.read_text())).id


def finish(state: DevnetState, task_id: str) -> None:
    """The run is over: delete the task, so the workers stop generating for a trainer that took its last
    step (it serves its checkpoints on for the judges of the last files: `--vote-window-seconds`)."""
    with admin_client(state) as client:
        client.delete(task_id)


def _get(url: str) -> Any:
    try:
        response = httpx.get(url, timeout=5)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def watch(
    state: DevnetState, plan: DemoPlan, trainer: ManagedProcess, validators: list[ManagedProcess],
    cheater: int | None, on_step: Callable[[int, float | None], None], progress: Progress,
    cheater_stake_before: int = 0,
) -> DemoReport:  # fmt: skip
    """Follow the run until the trainer reached `plan.steps` and worker `cheater`'s node was ejected
    (or timeout). `cheater_stake_before`: its provider's stake read before the task was posted (no
    file, so no slash, can come before that)."""
    started = time.monotonic()
    ledger = LedgerClient(state.rpc_url, Path(state.deployment_path), check=False)
    cheater_node = state.account(f"node-{cheater}").address if cheater else ""
    provider = state.account(f"provider-{cheater}").address if cheater else ""
    report = DemoReport(cheater=cheater_node, cheater_stake_before=cheater_stake_before)
    joined = False
    last_step = -1
    from workloads.trainer.checkpoints import CheckpointDir  # torch: only once a demo has run

    checkpoints = CheckpointDir(Path(state.directory) / "trainer")
    down_since: dict[str, float] = {}  # a process found dead, since when (a restart replaces it)
    while time.monotonic() - started < plan.timeout:
        history = checkpoints.history()  # from disk: the trainer stops training after the last step
        report.curve = [float(item.get("task_reward_mean", 0.0)) for item in history]
        report.steps = len(report.curve)
        trainer, validators = _followed(state, trainer, validators)
        for proc in (trainer, *validators):
            if proc.alive() or (proc is trainer and report.steps >= plan.steps):
                down_since.pop(proc.name, None)
            elif time.monotonic() - down_since.setdefault(proc.name, time.monotonic()) > RESTART_GRACE:
                raise DemoError(f"{proc.name} exited; see {proc.log}", report)
        if report.steps >= plan.steps and not report.steps_seconds:
            report.steps_seconds = time.monotonic() - started
        if report.steps != last_step:
            last_step = report.steps
            on_step(report.steps, report.curve[-1] if report.curve else None)
        if cheater_node and not report.cheater_ejected:
            in_pool = ledger.is_node_in_pool(state.pool_id, cheater_node)
            joined = joined or in_pool
            # Out of the pool after it was seen in it, or blacklisted there: a quorum may slash and
            # eject before this loop's first look (a busy machine), and that is the same outcome.
            report.cheater_ejected = not in_pool and (
                joined or ledger.is_node_blacklisted(state.pool_id, cheater_node))
            if report.cheater_ejected:
                progress(f"cheater {cheater_node} slashed and ejected by the validators' quorum")
        if report.steps >= plan.steps and (report.cheater_ejected or not cheater_node):
            break
        time.sleep(2.0)
    report.wall_seconds = time.monotonic() - started
    if provider:
        report.cheater_stake_after = ledger.get_provider(provider).stake
    _collect_verdicts(report, validators, cheater_node)
    for account in state.accounts:
        if account.role.startswith("node-"):
            report.claimable[account.address] = ledger.claimable_rewards(account.address)
            report.pending[account.address] = ledger.pending_rewards(account.address)
    _collect_honest_exits(report, state, ledger)
    _collect_hardware(report, state)
    return report


def _collect_hardware(report: DemoReport, state: DevnetState) -> None:
    nodes = {a.address.lower() for a in state.accounts if a.role.startswith("node-")}
    try:
        with admin_client(state) as client:
            listing = client.nodes().nodes
    except Exception:  # the report goes on without the figures
        return
    for record in listing:
        if record.address.lower() in nodes and record.hardware is not None:
            report.hardware[record.address] = record.hardware.model_dump(mode="json")


def _collect_honest_exits(report: DemoReport, state: DevnetState, ledger: LedgerClient) -> None:
    """Honest nodes no longer in the pool, with the orchestrator's reason (state and last transition)."""
    honest = [a.address for a in state.accounts  # nodes of this run's workers (a devnet funds a spare)
              if a.role.startswith("node-") and state.process("worker-" + a.role.removeprefix("node-"))
              and a.address.lower() != report.cheater.lower()]  # fmt: skip
    out = [n for n in honest if not ledger.is_node_in_pool(state.pool_id, n)]
    if not out:
        return
    try:
        with admin_client(state) as client:
            records = {r.address.lower(): r for r in client.nodes().nodes}
    except Exception as exc:  # the report still names them; the reason is then unknown
        records = {}
        progress_reason = f"orchestrator not readable: {exc}"
    else:
        progress_reason = "not known to the orchestrator"
    for node in out:
        record = records.get(node.lower())
        report.honest_out_of_pool[node] = (f"{record.state.value}: {record.reason}" if record is not None
                                           else progress_reason)  # fmt: skip


def _followed(
    state: DevnetState, trainer: ManagedProcess, validators: list[ManagedProcess]
) -> tuple[ManagedProcess, list[ManagedProcess]]:
    """The processes as the devnet's state file records them now: `devnet restart` saves the new pid."""
    current = DevnetState.load(Path(state.directory))
    if current is None:
        return trainer, validators
    return (current.process(trainer.name) or trainer,
            [current.process(v.name) or v for v in validators])


def _all_verdicts(validator: ManagedProcess) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    after = 0
    while True:
        page = _get(f"{validator.url}/verdicts?after={after}&limit=1000")
        if not page or not page.get("items"):
            return items
        items.extend(page["items"])
        after = page["items"][-1]["cursor"]


def _collect_verdicts(report: DemoReport, validators: list[ManagedProcess], cheater: str) -> None:
    for i, v in enumerate(validators):
        items = _all_verdicts(v)
        if i == 0:  # the first validator judged every file: the run's totals
            report.files_judged = len({item["work_key"] for item in items})
            report.files_accepted = sum(item["verdict"] == "accept" for item in items)
            report.tokens_generated = sum(int(item.get("tokens") or 0) for item in items)
        for item in items:
            mine = item["node"].lower() == cheater.lower()
            if not mine and item["verdict"] == "invalidate":
                report.honest_invalidations.append(
                    {"validator": v.name, "node": item["node"], "work_key": item["work_key"],
                     "reasons": item.get("reasons", [])[:3]}
                )  # fmt: skip
            if mine and item["verdict"] == "invalidate" and item.get("tx_hash"):
                report.slash_votes.append(
                    {"validator": v.name, "work_key": item["work_key"], "tx_hash": item["tx_hash"],
                     "reasons": item.get("reasons", [])[:2]}
                )  # fmt: skip


def write_curve(report: DemoReport, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "reward_curve.csv"
    with csv_path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["step", "task_reward_mean"])
        writer.writerows((i + 1, r) for i, r in enumerate(report.curve))
    report.curve_csv = str(csv_path)
    # matplotlib logs its font-cache build at INFO: a raw log line in the middle of the result table.
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the curve stays in the CSV
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(range(1, len(report.curve) + 1), report.curve, marker="o")
    ax.set_xlabel("trainer step")
    ax.set_ylabel("mean task reward (validated rollouts)")
    ax.set_title("intellect devnet --demo: string reversal, tiny model")
    ax.grid(alpha=0.3)
    png = out_dir / "reward_curve.png"
    fig.savefig(png, dpi=120, bbox_inches="tight")
    plt.close(fig)
    report.curve_png = str(png)
