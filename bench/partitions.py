"""Partitions during a whole RL run across hosts (issue 21): each link cut for 20 s and for 90 s.

Starts `intellect devnet up --demo --hosts` (every process on a host of its own, w2 and the cheating
w3 behind a NAT home router, three validators with a quorum of two) and, once the trainer has made
its first step, goes through the cells one at a time: cut a link (`World.partition`, the same call as
`intellect devnet partition A B`), watch, heal, and time how long until the whole run is back:

    back = every honest node Healthy at the orchestrator, the trainer made a step, every validator
           judged a file, and every honest worker had a file judged, all after the heal.

The same measure with no cut at all (the "none" row) is the floor set by the run's own pace (a step
every ~10-20 s, a file per worker and step). After the last cell the run drains and is audited:

- lost: a file an honest worker made that never reached the chain (its queue and upload journal),
  a file on chain that a validator never judged, a file rejected by the uploader;
- duplicated: a file judged twice by one validator, an on-chain vote cast twice, a work key in two
  of a node's payouts;
- wrongly ejected/slashed: an honest node seen Ejected, out of the pool, or with a file invalidated.

Each finding is attributed to the cell whose window (cut → back) holds its time. Every cell also
records what users saw: the node states during the cut, and the warnings and errors (and any
traceback) the processes at both ends logged.

    .venv/bin/python bench/partitions.py                     # every link, 20 s and 90 s (~45 min)
    .venv/bin/python bench/partitions.py --links orch-redis --durations 20
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devnet.hosts import World  # noqa: E402
from devnet.losses import Books, Worker  # noqa: E402
from devnet.state import DevnetState  # noqa: E402
from ledger.client import LedgerClient  # noqa: E402
from workloads.trainer.checkpoints import CheckpointDir  # noqa: E402

INTELLECT = str(Path(sys.executable).parent / "intellect")
console = Console(stderr=True)

# link name → (what the issue calls it, the host pairs cut). The orchestrator's files live on the
# `storage` host (an S3-compatible server) when it exists; the validators watch and vote on `chain`;
# the trainer reads accepted rollouts from v1 and every validator reads the trainer's step; the
# broadcast origin runs on the trainer's host; v1 is the validator cut from the other two.
LINKS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "worker-orch": ("worker ↔ orchestrator", [("w2", "orch")]),
    "worker-storage": ("worker ↔ storage", [("w2", "storage")]),
    "orch-chain": ("orchestrator ↔ chain", [("orch", "chain")]),
    "validator-chain": ("validator ↔ chain", [("v2", "chain")]),
    "validator-storage": ("validator ↔ storage", [("v2", "storage")]),
    "trainer-validators": ("trainer ↔ validators", [("trainer", "v1"), ("trainer", "v2"), ("trainer", "v3")]),
    "relay-origin": ("relay ↔ origin", [("relay", "trainer")]),
    "validator-validators": ("one validator ↔ the other two", [("v1", "v2"), ("v1", "v3")]),
    "orch-redis": ("orchestrator ↔ Redis", [("orch", "redis")]),
}
VALIDATORS = ("validator", "validator-2", "validator-3")


@dataclass
class Cell:
    link: str
    label: str
    seconds: int
    cut_at: float = 0.0
    healed_at: float = 0.0
    back_at: float | None = None
    waiting_for: list[str] = field(default_factory=list)  # what was not back when the watch gave up
    states: dict[str, list[str]] = field(default_factory=dict)  # honest node → states seen in the cut
    steps_in_cut: int = 0
    judged_in_cut: int = 0
    log_lines: list[str] = field(default_factory=list)
    tracebacks: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    wrongly: list[str] = field(default_factory=list)
    soft_vote: list[str] = field(default_factory=list)  # one validator's soft vote on an honest file
    stale: list[str] = field(default_factory=list)  # not paid: reached the validators too late to train on

    @property
    def recovery(self) -> float | None:
        return None if self.back_at is None else self.back_at - self.healed_at


class Run:
    """What the bench reads of a running `--demo --hosts` devnet: the orchestrator's node states, the
    validators' verdicts, the trainer's steps, the processes' logs."""

    def __init__(self, directory: Path) -> None:
        state = DevnetState.load(directory)
        if state is None or state.world is None:
            raise SystemExit(f"no --hosts devnet in {directory}")
        self.state = state
        self.directory = directory
        self.world = World.from_record(state.world)
        orch = state.process("orchestrator")
        assert orch is not None and orch.url
        self.orch = orch.url
        self.token = (directory / "orchestrator" / "admin-token").read_text().strip()
        self.validators = {name: p.url for name in VALIDATORS if (p := state.process(name)) and p.url}
        self.honest = {f"w{i}": state.account(f"node-{i}").address for i in (1, 2)}
        self.cheater = state.account("node-3").address
        self.checkpoints = CheckpointDir(directory / "trainer")
        self.seen: dict[str, list[dict[str, Any]]] = {name: [] for name in self.validators}

    def node_states(self) -> dict[str, str]:
        """Each honest node's state at the orchestrator, or what the orchestrator answered instead."""
        try:
            reply = httpx.get(
                f"{self.orch}/nodes", headers={"Authorization": f"Bearer {self.token}"}, timeout=5
            )
            if reply.status_code != 200:
                detail = str(reply.json().get("detail", ""))[:60] if reply.content else ""
                return {w: f"HTTP {reply.status_code} {detail}".strip() for w in self.honest}
            found = {n["address"].lower(): n["state"] for n in reply.json()["nodes"]}
        except httpx.TimeoutException:
            return {w: "no answer in 5 s" for w in self.honest}
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            return {w: f"orchestrator unreachable ({type(exc).__name__})" for w in self.honest}
        return {w: found.get(a.lower(), "unknown") for w, a in self.honest.items()}

    def verdicts(self) -> dict[str, list[dict[str, Any]]]:
        """Every verdict of each validator so far (read incrementally by cursor)."""
        for name, url in self.validators.items():
            items = self.seen[name]
            while True:
                after = items[-1]["cursor"] if items else 0
                try:
                    page = httpx.get(f"{url}/verdicts", params={"after": after, "limit": 1000}, timeout=5)
                    new = page.json().get("items", []) if page.status_code == 200 else []
                except (httpx.HTTPError, ValueError):
                    new = []
                if not new:
                    break
                items.extend(new)
        return self.seen

    def steps(self) -> int:
        return len(self.checkpoints.all_steps())

    def back(self, since: float, step: int) -> list[str]:
        """What is not back yet (empty: the whole run is)."""
        missing = [f"{w} {s}" for w, s in self.node_states().items() if s != "Healthy"]
        if self.steps() <= step:
            missing.append("trainer step")
        verdicts = self.verdicts()
        for name, items in verdicts.items():
            if not any(v["decided_at"] > since for v in items):
                missing.append(f"{name} judging")
        fresh = {v["node"].lower() for items in verdicts.values() for v in items if v["decided_at"] > since}
        missing += [f"{w}'s files judged" for w, a in self.honest.items() if a.lower() not in fresh]
        return missing

    def logs(self, hosts: set[str]) -> dict[str, tuple[Path, int]]:
        """Log file and current size of every process on `hosts` (read from there after the cut)."""
        names = {
            "orch": "orchestrator",
            "chain": "anvil",
            "redis": "redis",
            "storage": "storage",
            "trainer": "trainer",
            "relay": "broadcast-relay",
            "discovery": "discovery",
        }
        names |= {f"w{i}": f"worker-{i}" for i in range(1, 5)}
        names |= {f"v{i + 1}": role for i, role in enumerate(VALIDATORS)}
        found = {}
        for host in hosts:
            procs = [names.get(host, host)] + (["broadcast-origin"] if host == "trainer" else [])
            for name in procs:
                proc = self.state.process(name)
                if proc and proc.log and Path(proc.log).exists():
                    found[name] = (Path(proc.log), Path(proc.log).stat().st_size)
        return found


def read_new(logs: dict[str, tuple[Path, int]]) -> tuple[list[str], int]:
    """Warnings and errors logged since (distinct events, first few) and the number of tracebacks."""
    lines, tracebacks = [], 0
    seen: set[tuple[str, str]] = set()
    for name, (path, offset) in logs.items():
        with path.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
        tracebacks += text.count("Traceback (most recent call last)")
        for line in text.splitlines():
            try:
                record = json.loads(line)
                level, event = str(record.get("level", "")), str(record.get("event", ""))
                detail = record.get("error") or record.get("reason") or ""
            except (ValueError, AttributeError):
                low = line.lower()
                level = "warning" if "warn" in low else "error" if "error" in low else ""
                event, detail = line.strip()[:160], ""
            if level in ("warning", "error", "critical") and (name, event) not in seen:
                seen.add((name, event))
                lines.append(f"{name}: {level}: {event}" + (f" ({str(detail)[:120]})" if detail else ""))
    return lines[:8], tracebacks


def measure(run: Run, cell: Cell, pairs: list[tuple[str, str]], back_timeout: float) -> None:
    step_before, judged_before = run.steps(), sum(len(v) for v in run.verdicts().values())
    logs = run.logs({h for pair in pairs for h in pair})
    cell.cut_at = time.time()
    for a, b in pairs:
        run.world.partition(a, b)
    seen: dict[str, set[str]] = {w: set() for w in run.honest}
    while time.time() - cell.cut_at < cell.seconds:
        for w, s in run.node_states().items():
            seen[w].add(s)
        time.sleep(1.0)
    for a, b in pairs:
        run.world.heal(a, b)
    cell.healed_at = time.time()
    cell.states = {w: sorted(s) for w, s in seen.items()}
    step_at_heal = run.steps()
    cell.steps_in_cut = step_at_heal - step_before
    cell.judged_in_cut = sum(len(v) for v in run.verdicts().values()) - judged_before
    while time.time() - cell.healed_at < back_timeout:
        missing = run.back(cell.healed_at, step_at_heal)
        if not missing:
            cell.back_at = time.time()
            break
        cell.waiting_for = missing
        time.sleep(1.0)
    if cell.back_at is not None:
        cell.waiting_for = []
    cell.log_lines, cell.tracebacks = read_new(logs)
    if any("Ejected" in s for s in cell.states.values()):
        cell.wrongly.append("an honest node was seen Ejected during the cut")


def audit(run: Run, cells: list[Cell], cutoff: float, drain: float) -> dict[str, Any]:
    """The run's books (devnet/losses.py) for files made before `cutoff`, after up to `drain` s for them
    to get through; each finding goes to the cell whose window (cut → back) holds its time."""
    ledger = LedgerClient(run.state.rpc_url, Path(run.state.deployment_path), check=False)
    workers = [Worker(w, a, run.directory / f"worker-{w[1:]}") for w, a in run.honest.items()]
    books = Books(ledger, run.state.pool_id, workers, run.validators, run.cheater)
    found, counts = books.findings(cutoff, drain)
    totals: Counter[str] = Counter(counts)
    for f in found:
        totals[f.kind] += 1
        cell = next((c for c in cells if c.cut_at <= f.at <= (c.back_at or c.healed_at + 600)), None)
        if cell is not None:
            getattr(cell, f.kind).append(f.what)
        else:
            totals[f"{f.kind}_outside_cuts"] += 1
    return dict(totals) | {"findings": [f"{f.kind}: {f.what}" for f in found][:50]}


def start(directory: Path, steps: int, log: Path) -> subprocess.Popen[bytes]:
    argv = [
        INTELLECT,
        "devnet",
        "up",
        "--demo",
        "--hosts",
        "--dir",
        str(directory),
        "--workers",
        "3",
        "--validators",
        "3",
        "--quorum",
        "2",
        "--steps",
        str(steps),
        "--timeout",
        "7200",
        "--json",
    ]
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--links", nargs="+", default=list(LINKS), choices=list(LINKS))
    parser.add_argument("--durations", nargs="+", type=int, default=[20, 90])
    parser.add_argument("--back-timeout", type=float, default=240, help="give up on 'back' after this")
    parser.add_argument("--drain", type=float, default=240, help="seconds to let judging catch up")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/intellect-partitions"))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "partitions.json")
    args = parser.parse_args()

    directory = args.dir.resolve()
    subprocess.run([INTELLECT, "devnet", "down", "--dir", str(directory), "--purge"], capture_output=True)
    directory.parent.mkdir(parents=True, exist_ok=True)
    log = directory.parent / f"{directory.name}.up.log"
    demo = start(directory, steps=1000, log=log)
    started = time.time()
    cells: list[Cell] = []
    result: dict[str, Any] = {}
    try:
        while not (directory / "trainer" / "step_1.json").exists():
            if demo.poll() is not None or time.time() - started > 900:
                raise SystemExit(f"the demo did not reach its first step; see {log}")
            time.sleep(1)
        run = Run(directory)
        console.print(f"first step after {time.time() - started:.0f} s; hosts: {', '.join(run.world.hosts)}")
        floor = Cell("none", "no cut (the run's own pace)", 0)
        measure(run, floor, [], args.back_timeout)
        cells.append(floor)
        console.print(
            f"no cut: back in {floor.recovery:.1f} s" if floor.recovery is not None else "no cut: ?"
        )
        for link in args.links:
            label, pairs = LINKS[link]
            if any(h not in run.world.hosts for pair in pairs for h in pair):
                console.print(f"[yellow]{link}: no such hosts in this devnet ({pairs}), skipped[/yellow]")
                continue
            for seconds in args.durations:
                cell = Cell(link, label, seconds)
                measure(run, cell, pairs, args.back_timeout)
                cells.append(cell)
                back = (
                    f"{cell.recovery:.1f} s" if cell.recovery is not None else f"NOT back: {cell.waiting_for}"
                )
                console.print(
                    f"{label} {seconds} s: back {back}; states {cell.states}; "
                    f"{len(cell.log_lines)} warning kinds, {cell.tracebacks} tracebacks"
                )
        totals = audit(run, cells, time.time(), args.drain)
        history = run.checkpoints.history()
        curve = [float(h.get("task_reward_mean", 0.0)) for h in history]
        k = max(1, min(5, len(curve) // 2))
        result = {
            "started": started,
            "wall_seconds": time.time() - started,
            "steps": len(curve),
            "reward_first5": sum(curve[:k]) / k,
            "reward_last5": sum(curve[-k:]) / k,
            "totals": totals,
            "cells": [asdict(c) | {"recovery": c.recovery} for c in cells],
        }
    finally:
        demo.send_signal(signal.SIGTERM)
        try:
            demo.wait(timeout=60)
        except subprocess.TimeoutExpired:
            demo.kill()
        subprocess.run([INTELLECT, "devnet", "down", "--dir", str(directory)], capture_output=True)
        if result:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2))
    table = Table(
        title=f"partitions during a {result['wall_seconds']:.0f} s RL run across hosts "
        f"({result['steps']} steps, reward {result['reward_first5']:.3f} → {result['reward_last5']:.3f})"
    )
    for column in (
        "link cut",
        "s",
        "back after heal",
        "lost",
        "dup.",
        "wrongly punished",
        "lone soft votes",
        "honest states in cut",
        "steps/judged in cut",
        "tracebacks",
    ):
        table.add_column(column)
    for c in cells:
        states = "; ".join(f"{w} {'/'.join(s)}" for w, s in c.states.items())
        back = f"{c.recovery:.1f} s" if c.recovery is not None else "not back: " + ", ".join(c.waiting_for)
        table.add_row(
            c.label,
            str(c.seconds),
            back,
            str(len(c.lost)),
            str(len(c.duplicated)),
            str(len(c.wrongly)),
            str(len(c.soft_vote)),
            states,
            f"{c.steps_in_cut}/{c.judged_in_cut}",
            str(c.tracebacks),
        )
    Console().print(table)
    print(json.dumps({"totals": result["totals"], "out": str(args.out)}))


if __name__ == "__main__":
    main()
