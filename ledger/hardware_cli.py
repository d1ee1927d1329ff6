"""The pool owner's view of what nodes proved of their hardware (docs/hardware.md): the figures next to
`intellect-pool nodes`, and `intellect-pool hardware-evidence`, which re-runs the check on every
wrong answer the orchestrator recorded for a node, with nothing but the evidence (the challenge, the
node's signed commitment and answer, the challenger's secret), before the owner acts on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from intellect.client import OrchestratorClient, TaskApiError
from intellect.hardware_evidence import judge_evidence
from intellect.wire.admin import hardware_summary
from ledger.cli_common import Chain, address
from ledger.errors import LedgerError

# Shared by `nodes` (the figures beside the chain's record) and `hardware-evidence` (where it is read).
OrchestratorUrl = Annotated[str | None, typer.Option(
    "--orchestrator", envvar="INTELLECT_ORCHESTRATOR_URL", help="the pool's orchestrator: what its nodes "
    "PROVED of their hardware (docs/hardware.md)")]  # fmt: skip
AdminToken = Annotated[str | None, typer.Option(
    "--token", envvar="INTELLECT_ADMIN_TOKEN", help="the orchestrator's admin token")]  # fmt: skip


def proven_by_node(url: str, token: str | None) -> dict[str, dict[str, Any]]:
    """Each node's latest hardware challenge, as the orchestrator's /nodes reports it."""
    if not token:
        raise LedgerError("--orchestrator needs the admin token: --token or INTELLECT_ADMIN_TOKEN")
    try:
        with OrchestratorClient(url, token=token, retries=1) as client:
            listing = client.nodes()
    except TaskApiError as exc:
        raise LedgerError(f"orchestrator {url}: {exc}") from None
    return {n.address: n.hardware.model_dump(mode="json") for n in listing.nodes if n.hardware is not None}


def proven_cells(hardware: dict[str, Any] | None) -> list[str]:
    if not hardware:
        return ["-", "-"]
    return [hardware_summary(hardware), str(hardware["at"])[:19]]


def hardware_evidence(
    chain: Chain,
    node: str,
    orchestrator: OrchestratorUrl = None,
    token: AdminToken = None,
    file: Annotated[Path | None, typer.Option(
        "--file", help="or from a file: that reply saved as JSON, or one piece of evidence")] = None,
) -> None:
    """Check again every wrong hardware answer recorded for NODE: does its own signed answer contradict
    its challenge? (A verdict anyone can reproduce; nothing is sent or signed.)"""
    who = address(node, "node")
    if (orchestrator is None) == (file is None):
        raise LedgerError("give the evidence's source: --orchestrator URL (with --token) or --file PATH")
    if file is not None:
        try:
            loaded = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise LedgerError(f"{file}: not readable JSON ({exc})") from None
        pieces = loaded.get("evidence", [loaded]) if isinstance(loaded, dict) else []
    else:
        if not token:
            raise LedgerError("--orchestrator needs the admin token: --token or INTELLECT_ADMIN_TOKEN")
        try:
            with OrchestratorClient(orchestrator or "", token=token, retries=1) as client:
                pieces = client.node_hardware(who).evidence
        except TaskApiError as exc:
            raise LedgerError(f"orchestrator {orchestrator}: {exc}") from None
    rows: list[dict[str, Any]] = []
    for piece in pieces:
        try:
            kind, reasons = judge_evidence(who, piece)
        except ValueError as exc:
            kind, reasons = "not evidence", [str(exc)]
        challenge = piece.get("challenge", {}) if isinstance(piece, dict) else {}
        rows.append({"challenge_id": challenge.get("challenge_id"), "n": challenge.get("n"),
                     "precision": challenge.get("precision"), "verdict": kind,
                     "reasons": reasons})  # fmt: skip
    table = Table(title=f"{who}: {len(rows)} recorded wrong answer(s), judged again")
    for col in ("challenge", "n", "precision", "verdict", "reasons"):
        table.add_column(col, overflow="fold")
    for r in rows:
        labels = {"wrong": "[red]wrong, signed by the node[/red]", "unsigned": "not its signed words",
                  "right": "the answer holds"}  # fmt: skip
        shown = labels.get(str(r["verdict"]), str(r["verdict"]))
        table.add_row(str(r["challenge_id"])[:16] + "…", str(r["n"]), str(r["precision"]), shown,
                      "; ".join(r["reasons"])[:300])  # fmt: skip
    chain.emit(rows, table)
