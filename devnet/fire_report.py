"""What `intellect devnet fire` reports: per node its role, its verdicts, its stake before and after, its
tokens locked and claimable, and whether it is still in the pool; per cheater the rule that caught it;
the faults as they ran; and the promise as checks a reader (or CI) can hold the run to:

- the reward rose from the first step to the last;
- every cheater was slashed (stake taken, out of the pool) or refused (never invited);
- no honest node lost stake, was voted invalid, or was blacklisted;
- every payout reconciles and every paid file has the validators' accept, traced by `intellect-pool
  audit` (run as a user runs it) after each node's matured rewards were claimed.
"""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devnet.demo import admin_client, provider_stake
from devnet.demo import finish as finish_task
from devnet.fire import FaultRunner, FireRun, Progress, Role
from devnet.losses import all_verdicts
from devnet.processes import BIN
from devnet.state import DevnetState
from intellect.identity import Wallet
from ledger.client import LedgerClient

SLASHED_CHEATS = ("perturbed-model", "inflated-units", "frame", "withhold", "copy")


@dataclass
class NodeResult:
    index: int
    address: str
    role: str
    cheat: str | None
    verdicts: dict[str, int] = field(default_factory=dict)  # verdict → files (the first validator)
    reasons: list[str] = field(default_factory=list)  # of what was not accepted, the first few
    invalid_votes: int = 0  # invalidate verdicts by any validator
    stake_before: int = 0
    stake_after: int = 0
    locked: int = 0
    claimable: int = 0
    claimed: int = 0
    in_pool: bool = False
    blacklisted: bool = False
    orchestrator: str = ""  # its state and reason there
    caught_by: str = ""  # the rule, for a cheater
    audit: dict[str, Any] = field(default_factory=dict)

    @property
    def slashed(self) -> bool:
        return self.stake_after < self.stake_before


@dataclass
class FireReport:
    seed: int
    short: bool
    steps: int = 0
    curve: list[float] = field(default_factory=list)
    nodes: list[NodeResult] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    # devnet/losses.py over the honest workers: files made but not on chain, not judged by every
    # validator, judged or paid twice, or punished wrongly (a stale file, not paid by policy, is apart)
    books: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    rise: float = 0.0  # the mean reward of the last 3 steps less that of the first 3
    wall_seconds: float = 0.0
    load: list[float] = field(default_factory=list)
    evidence: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(self.checks.values())

    def as_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "nodes"}
        data["nodes"] = [n.__dict__ | {"slashed": n.slashed} for n in self.nodes]
        return data | {"ok": self.ok}


def watch(run: FireRun, faults: FaultRunner, progress: Progress) -> None:
    """Until the trainer has its steps and every cheater is caught, or the plan's timeout."""
    from workloads.trainer.checkpoints import CheckpointDir  # torch: only once a run has started

    state = run.state
    checkpoints = CheckpointDir(Path(state.directory) / "trainer")
    ledger = LedgerClient(state.rpc_url, Path(state.deployment_path), check=False)
    began, seen_steps = time.monotonic(), 0
    while time.monotonic() - began < run.plan.timeout:
        steps = len(checkpoints.history())
        if steps and not faults.begun.is_set():
            run.first_step_at = time.time()
            faults.begin()
        if steps != seen_steps:
            seen_steps = steps
            progress(f"trainer step {steps} of {run.plan.trainer_steps}")
        done_faults = all(f.ended is not None for f in run.faults)
        if (steps >= run.plan.trainer_steps and done_faults
                and all(caught(run, r, ledger) for r in run.roster if r.cheat) and matured(run, ledger)):
            break
        time.sleep(3)
    else:
        run.timed_out = True
    faults.stop_now.set()
    run.ended_at = time.time()
    finish(run, progress)


def finish(run: FireRun, progress: Progress) -> None:
    """The run is over: its tasks deleted, so the workers stop generating for a trainer that took its
    last step (it serves its checkpoints on for the judges of the last files)."""
    for task_id in run.task_ids:
        try:
            finish_task(run.state, task_id)
        except Exception as exc:  # the report matters more: say what is left running
            progress(f"could not delete task {task_id}: {exc}")


def caught(run: FireRun, role: Role, ledger: LedgerClient) -> bool:
    node = run.state.account(f"node-{role.index}").address
    if role.cheat == "hardware":
        return refused_for_hardware(run.state, node) != ""
    return ledger.is_node_blacklisted(run.state.pool_id, node) or (
        not ledger.is_node_in_pool(run.state.pool_id, node)
        and provider_stake(run.state, role.index, ledger) < run.stakes_before.get(role.index, 0))


def matured(run: FireRun, ledger: LedgerClient) -> bool:
    """Every honest node has rewards it can claim: the audit then traces a payout of each."""
    nodes = [run.state.account(f"node-{r.index}").address for r in run.roster if not r.cheat]
    return all(ledger.claimable_rewards(node) > 0 for node in nodes)


def orchestrator_nodes(state: DevnetState) -> dict[str, dict[str, Any]]:
    """Every node's record at the orchestrator (its state and the reason), by lower-case address; none
    while it does not answer (it may be restarting: a fault)."""
    try:
        with admin_client(state) as client:
            return {n.address.lower(): n.model_dump(mode="json") for n in client.nodes().nodes}
    except Exception:  # the watch asks again; the report says "unknown"
        return {}


def refused_for_hardware(state: DevnetState, node: str) -> str:
    """The orchestrator's reason when it refused `node` for a wrong hardware answer ("" otherwise)."""
    record = orchestrator_nodes(state).get(node.lower())
    reason = str((record or {}).get("reason") or "")
    return reason if "hardware" in reason.lower() or "answered wrongly" in reason.lower() else ""


def collect(run: FireRun, progress: Progress) -> FireReport:
    """The report of a finished (or timed-out) run; claims each node's matured rewards first, so the
    audit has payouts to trace."""
    from workloads.trainer.checkpoints import CheckpointDir

    state = DevnetState.load(Path(run.state.directory)) or run.state
    report = FireReport(seed=run.plan.seed, short=run.plan.short, faults=run.faults_json(), groups=run.groups)
    history = CheckpointDir(Path(state.directory) / "trainer").history()
    report.curve = [float(item.get("task_reward_mean", 0.0)) for item in history]
    report.steps = len(report.curve)
    validators = [p for p in state.processes if p.name.startswith("validator") and p.url]
    votes = {v.name: all_verdicts(v.url or "") for v in validators}
    ledger = LedgerClient(state.rpc_url, Path(state.deployment_path), check=False)
    records = orchestrator_nodes(state)
    progress("claiming matured rewards and tracing every payout with `intellect-pool audit`")
    for role in run.roster:
        report.nodes.append(node_result(run, state, role, votes, ledger, records))
    with ThreadPoolExecutor(4) as pool:
        audits = list(pool.map(lambda n: audit(state, n.address, [v.url or "" for v in validators]),
                               report.nodes))  # fmt: skip
    for node, found in zip(report.nodes, audits, strict=True):
        node.audit = found
    report.books = books(run, state, {v.name: v.url or "" for v in validators}, ledger, progress)
    judge(report, run)
    report.wall_seconds = run.ended_at - run.began_at
    return report


def books(run: FireRun, state: DevnetState, validators: dict[str, str], ledger: LedgerClient,
          progress: Progress) -> dict[str, Any]:  # fmt: skip
    """The honest workers' books (devnet/losses.py) for the files made until 30 s before the trainer's
    last step (the tasks are deleted then: what was in flight is refused by policy, not lost), given
    two minutes to settle."""
    from devnet.losses import Books, Worker

    steps = sorted(Path(state.directory, "trainer").glob("step_*.json"), key=lambda p: p.stat().st_mtime)
    if not steps:
        return {"counts": {}, "findings": ["no trainer step: nothing to account for"]}
    honest = [Worker(r.host, state.account(f"node-{r.index}").address, Path(state.directory) / r.name)
              for r in run.roster if not r.cheat]  # fmt: skip
    progress("settling the honest workers' books: every file made on chain and judged by every validator")
    found, counts = Books(ledger, state.pool_id, honest, validators).findings(
        cutoff=steps[-1].stat().st_mtime - 30, drain=120)
    apart_kinds = ("soft_vote", "stale", "framed")  # not paid by policy, never slashed: counted, not failed
    serious = [f"{f.kind}: {f.what}" for f in found if f.kind not in apart_kinds]
    apart = {kind: sum(f.kind == kind for f in found) for kind in apart_kinds}
    return {"counts": counts | apart, "findings": serious}


def node_result(run: FireRun, state: DevnetState, role: Role, votes: dict[str, list[dict[str, Any]]],
                ledger: LedgerClient, records: dict[str, dict[str, Any]]) -> NodeResult:  # fmt: skip
    address = state.account(f"node-{role.index}").address
    mine = {name: [v for v in items if v["node"].lower() == address.lower()] for name, items in votes.items()}
    first = mine.get("validator", next(iter(mine.values()), []))
    result = NodeResult(role.index, address, role.label(), role.cheat,
                        stake_before=run.stakes_before.get(role.index, 0))
    for item in first:
        result.verdicts[item["verdict"]] = result.verdicts.get(item["verdict"], 0) + 1
    refused = [v for items in mine.values() for v in items if v["verdict"] != "accept"]
    result.reasons = sorted({r for v in refused for r in v.get("reasons", [])[:1]})[:4]
    result.invalid_votes = sum(v["verdict"] == "invalidate" for items in mine.values() for v in items)
    result.stake_after = provider_stake(state, role.index, ledger)
    result.in_pool = ledger.is_node_in_pool(state.pool_id, address)
    result.blacklisted = ledger.is_node_blacklisted(state.pool_id, address)
    record = records.get(address.lower(), {})
    result.orchestrator = f"{record.get('state', 'unknown')}: {record.get('reason') or ''}".strip(": ")
    if role.cheat == "hardware":
        result.caught_by = refused_for_hardware(state, address)
    elif role.cheat:
        voted = [v for items in mine.values() for v in items
                 if v["verdict"] == "invalidate" and v.get("tx_hash")]  # fmt: skip
        result.caught_by = "; ".join(sorted({v.get("reasons", ["?"])[0] for v in voted}))[:300]
    result.locked = ledger.pending_rewards(address)
    result.claimable = ledger.claimable_rewards(address)
    if result.claimable:
        provider = Wallet.from_key(state.account(f"provider-{role.index}").private_key)
        claimer = LedgerClient(state.rpc_url, Path(state.deployment_path), provider)
        claimer.claim_rewards(address)
        result.claimed, result.claimable = result.claimable, ledger.claimable_rewards(address)
    return result


def audit(state: DevnetState, node: str, validator_urls: list[str]) -> dict[str, Any]:
    """`intellect-pool audit --node … --json`, as a pool owner runs it: payouts, whether each reconciles,
    and every paid work key with its votes and verdicts."""
    argv = [str(BIN / "intellect-pool"), "audit", "--node", node, "--rpc-url", state.rpc_url,
            "--deployment", state.deployment_path, "--json"]  # fmt: skip
    for url in validator_urls:
        argv += ["--validator-url", url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if done.returncode:
        return {"error": done.stderr.strip()[-500:]}
    found = json.loads(done.stdout)
    paid = [w for p in found.get("payouts", []) for w in p.get("work", [])]
    return {
        "payouts": len(found.get("payouts", [])),
        "reconciled": all(p.get("reconciled") for p in found.get("payouts", [])),
        "paid_files": len(paid),
        "paid_tokens": sum(int(p.get("amount", 0)) for p in found.get("payouts", [])),
        "paid_without_accept": [w["work_key"] for w in paid
                                if not any(v.get("verdict") == "accept" for v in w.get("verdicts", []))],
        "unpaid": len(found.get("unpaid", [])),
    }  # fmt: skip


def judge(report: FireReport, run: FireRun) -> None:
    """The promise, as checks."""
    k = max(1, min(3, len(report.curve) // 2))
    curve = report.curve
    report.rise = sum(curve[-k:]) / k - sum(curve[:k]) / k if curve else 0.0
    report.checks["trainer reached its steps"] = report.steps >= run.plan.trainer_steps
    if not run.plan.short:  # four steps are too few for a rise to stand out of a step's noise
        report.checks["reward rose"] = report.rise > 0
    for node in report.nodes:
        if node.cheat == "hardware":
            report.checks[f"{node.cheat} cheater refused"] = bool(node.caught_by) and not node.in_pool
        elif node.cheat:
            report.checks[f"{node.cheat} cheater slashed"] = node.slashed and not node.in_pool
        else:
            if node.slashed or node.invalid_votes or node.blacklisted:
                report.problems.append(f"honest node {node.index} ({node.address}): stake "
                                       f"{node.stake_before} → {node.stake_after}, {node.invalid_votes} "
                                       f"invalidate votes, blacklisted {node.blacklisted}")  # fmt: skip
        bad = node.audit.get("error") or node.audit.get("paid_without_accept")
        if bad or (node.audit.get("payouts") and not node.audit.get("reconciled")):
            report.problems.append(f"audit of node {node.index}: {node.audit}")
    honest = [n for n in report.nodes if not n.cheat]
    report.checks["no honest node slashed, voted invalid or blacklisted"] = not any(
        n.slashed or n.invalid_votes or n.blacklisted for n in honest)
    report.checks["honest nodes earned"] = all(n.locked + n.claimable + n.claimed > 0 for n in honest)
    report.checks["every payout reconciled and every paid file accepted"] = not any(
        n.audit.get("error") or n.audit.get("paid_without_accept")
        or (n.audit.get("payouts") and not n.audit.get("reconciled")) for n in report.nodes)
    on_chain = report.books.get("counts", {}).get("honest_files_on_chain", 0)
    report.checks["nothing lost, counted twice or punished wrongly (the books)"] = (
        not report.books.get("findings") and on_chain > 0)
    report.checks["every fault ran"] = all(not str(f["outcome"]).startswith(("failed", "pending"))
                                           for f in report.faults)  # fmt: skip
