"""`intellect devnet fire`: the whole protocol under fire (devnet/fire.py), its result as a table or
`--json`, and its evidence kept in `<dir>/fire/`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from devnet import network
from devnet.fire import FaultRunner, FirePlan, start
from devnet.fire_report import FireReport, collect, watch
from devnet.hosts import HostsError, require_privileges
from devnet.options import DirOption
from devnet.state import DevnetState

# Redirected to a file (the evidence a run keeps), a table as wide as its columns want: at the default
# 80 columns a reason is folded into a word a line.
console = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, soft_wrap=True)


def fire(
    directory: Path = DirOption,
    seed: int = typer.Option(1, help="draws the faults' times and targets (printed before they happen)"),
    short: bool = typer.Option(False, "--short", help="4 steps and 3 faults (what CI runs); every cheater "
                               "kind kept"),  # fmt: skip
    steps: int = typer.Option(0, min=0, help="trainer steps (default 30; 4 with --short)"),
    timeout: float = typer.Option(3600, min=60, help="give up after this many seconds of the run"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """One RL run with everything at once on namespaced hosts (root): a group of 2 and a group of 3 over
    links held 50 ms, single nodes (one behind NAT), three validators with a 2-of-3 quorum, the trainer
    and the broadcast; one cheater of every kind; faults at seeded times. Ends with each node's verdicts,
    stake before and after, tokens, the rule that caught each cheater, and every payout traced by
    `intellect-pool audit`. Exit 0 only if every cheater was caught and no honest node lost anything."""
    plan = FirePlan(seed=seed, short=short, steps=steps, timeout=timeout)
    say = lambda msg: err.print(msg, markup=False)  # noqa: E731 - progress on stderr: stdout is the report
    try:
        require_privileges()
    except HostsError as exc:
        err.print(f"[red]devnet fire:[/red] {exc}")
        raise typer.Exit(2) from None
    if DevnetState.load(directory.resolve()) is not None or network.strays(directory):
        say(f"a new run: stopping the devnet in {directory} and removing its state")
        network.down(directory, purge=True, progress=lambda msg: None)
    for fault in plan.faults():
        say(f"planned fault (seed {seed}): {fault.describe()} after the trainer's first step")
    try:
        run = start(directory, plan, say)
    except Exception as exc:  # one line for the user; the logs are in the devnet's folder
        err.print(f"devnet fire failed to start: {exc or type(exc).__name__} (logs in {directory})",
                  markup=False)  # fmt: skip
        network.down(directory, purge=False, progress=lambda msg: None)
        raise typer.Exit(1) from None
    faults = FaultRunner(run, say)
    faults.start()
    watch(run, faults, say)
    report = collect(run, say)
    report.load = list(os.getloadavg())
    report.evidence = str(keep_evidence(report, Path(run.state.directory)))
    if as_json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        render(report)
        console.print(f"Evidence and logs: {report.evidence}. The devnet still runs: "
                      f"`intellect devnet down --dir {directory}`.", soft_wrap=True)
    if not report.ok or report.problems:
        raise typer.Exit(1)


def keep_evidence(report: FireReport, directory: Path) -> Path:
    folder = directory / "fire"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report.as_dict(), indent=2))
    return folder


def tokens(wei: int) -> str:
    return f"{wei / 1e18:g}"


def render(report: FireReport) -> None:
    form = "short" if report.short else "full"
    reward = (f"reward {report.curve[0]:.3f} → {report.curve[-1]:.3f} (last 3 less first 3: "
              f"{report.rise:+.3f})" if report.curve else "no step taken")  # fmt: skip
    table = Table(title=f"intellect devnet fire (seed {report.seed}, {form} form): {report.steps} steps, "
                  f"{reward}")  # fmt: skip
    for column in ("node", "role", "verdicts", "caught by / not paid for", "stake", "locked", "paid",
                   "in pool", "audit"):  # fmt: skip
        table.add_column(column, overflow="fold")
    for n in report.nodes:
        verdicts = ", ".join(f"{k} {v}" for k, v in sorted(n.verdicts.items())) or "none"
        why = n.caught_by or "; ".join(n.reasons)
        reconciled = "reconciled" if n.audit.get("reconciled") else "NOT reconciled"
        audit = (f"{n.audit.get('payouts', 0)} payouts, {reconciled}" if "error" not in n.audit
                 else f"error: {n.audit['error'][:60]}")  # fmt: skip
        table.add_row(f"{n.index} {n.address[:10]}…", n.role, verdicts, why[:120],
                      f"{tokens(n.stake_before)} → {tokens(n.stake_after)}", tokens(n.locked),
                      tokens(n.claimed + n.claimable), "yes" if n.in_pool else "no", audit)  # fmt: skip
    console.print(table)
    faults = Table(title="faults (seeded)")
    for column in ("planned", "outcome"):
        faults.add_column(column, overflow="fold")
    for f in report.faults:
        held = f" for {f['hold']:.0f} s" if f["hold"] else ""
        faults.add_row(f"t+{f['at']:.0f} s {f['kind']} {f['target']}{held}", str(f["outcome"]))
    console.print(faults)
    for name, ok in report.checks.items():
        console.print(f"{'[green]✓[/green]' if ok else '[red]✗[/red]'} {name}")
    for problem in report.problems:
        console.print(f"[red]problem:[/red] {problem}", soft_wrap=True)
