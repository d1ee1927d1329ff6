"""The pool owner's view of what nodes proved of their hardware (docs/hardware.md): the figures next to
`intellect-pool nodes`, and `intellect-pool hardware-evidence`, which re-runs the check on every
wrong answer the orchestrator recorded for a node, with nothing but the evidence (the challenge, the
node's signed commitment and answer, the challenger's secret), before the owner acts on it; and
`intellect-pool slashing hardware`, a validator's vote to slash for such an answer, judged first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from intellect.client import OrchestratorClient, TaskApiError
from intellect.hardware_evidence import evidence_digest, judge_evidence
from intellect.wire.admin import hardware_summary
from ledger.cli_options import Chain, address, fmt_tokens
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


EvidenceFile = Annotated[Path | None, typer.Option(
    "--file", help="or from a file: that reply saved as JSON, or one piece of evidence")]  # fmt: skip


def load_evidence(who: str, orchestrator: str | None, token: str | None, file: Path | None) -> list[Any]:
    """The recorded wrong answers of `who`: from the orchestrator's `GET /nodes/{who}/hardware` or a
    file (that reply, or one piece)."""
    if (orchestrator is None) == (file is None):
        raise LedgerError("give the evidence's source: --orchestrator URL (with --token) or --file PATH")
    if file is not None:
        try:
            loaded = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise LedgerError(f"{file}: not readable JSON ({exc})") from None
        return loaded.get("evidence", [loaded]) if isinstance(loaded, dict) else []
    if not token:
        raise LedgerError("--orchestrator needs the admin token: --token or INTELLECT_ADMIN_TOKEN")
    try:
        with OrchestratorClient(orchestrator or "", token=token, retries=1) as client:
            return list(client.node_hardware(who).evidence)
    except TaskApiError as exc:
        raise LedgerError(f"orchestrator {orchestrator}: {exc}") from None


def judged(who: str, pieces: list[Any]) -> list[dict[str, Any]]:
    """Each piece judged again with nothing but itself, with the digest a slash vote names."""
    rows: list[dict[str, Any]] = []
    for piece in pieces:
        try:
            kind, reasons = judge_evidence(who, piece)
            # an unopened commitment is no slashable evidence: nothing for a vote to name
            digest: str | None = None if kind == "unopened" else "0x" + evidence_digest(piece).hex()
        except ValueError as exc:
            kind, reasons, digest = "not evidence", [str(exc)], None
        challenge = piece.get("challenge", {}) if isinstance(piece, dict) else {}
        rows.append({"challenge_id": challenge.get("challenge_id"), "n": challenge.get("n"),
                     "precision": challenge.get("precision"), "verdict": kind, "reasons": reasons,
                     "evidence": digest})  # fmt: skip
    return rows


def hardware_evidence(
    chain: Chain,
    node: str,
    orchestrator: OrchestratorUrl = None,
    token: AdminToken = None,
    file: EvidenceFile = None,
) -> None:
    """Check again every wrong hardware answer recorded for NODE: does its own signed answer contradict
    its challenge? (A verdict anyone can reproduce; nothing is sent or signed.)"""
    who = address(node, "node")
    rows = judged(who, load_evidence(who, orchestrator, token, file))
    table = Table(title=f"{who}: {len(rows)} recorded wrong answer(s), judged again")
    for col in ("challenge", "n", "precision", "verdict", "reasons"):
        table.add_column(col, overflow="fold")
    for r in rows:
        labels = {"wrong": "[red]wrong, signed by the node[/red]", "unsigned": "not its signed words",
                  "right": "the answer holds",
                  "unopened": "committed, never opened: not invited (off chain, no stake)"}  # fmt: skip
        shown = labels.get(str(r["verdict"]), str(r["verdict"]))
        table.add_row(str(r["challenge_id"])[:16] + "…", str(r["n"]), str(r["precision"]), shown,
                      "; ".join(r["reasons"])[:300])  # fmt: skip
    chain.emit(rows, table)


def slash_hardware(
    chain: Chain,
    pool_id: Annotated[int, typer.Argument(min=1, help="pool id")],
    node: str,
    orchestrator: OrchestratorUrl = None,
    token: AdminToken = None,
    file: EvidenceFile = None,
) -> None:
    """Vote, as one of the pool's validators, to slash NODE for a wrong hardware answer it signed. The
    evidence is judged here first, with nothing but itself: only an answer that is the node's own
    signed words and fails its challenge is voted on (an unsigned or right one is refused). The pool's
    quorum decides as for work: the deciding vote slashes, drops locked rewards, ejects, blacklists."""
    who = address(node, "node")
    rows = judged(who, load_evidence(who, orchestrator, token, file))
    wrong = [r for r in rows if r["verdict"] == "wrong"]
    if not wrong:
        seen = ", ".join(sorted({str(r["verdict"]) for r in rows})) or "no evidence at all"
        raise LedgerError(f"nothing here convicts {who} (judged again: {seen}); no vote sent")
    piece = wrong[0]
    c = chain.signer()
    result = c.slashing.vote_slash_hardware(pool_id, who, bytes.fromhex(str(piece["evidence"])[2:]))
    slashed, voted = result.event("NodeSlashedForHardware"), result.event("HardwareSlashVoted")
    if slashed:
        what = f"decided: slashed {fmt_tokens(slashed.args['slashed'])} tokens, ejected and blacklisted"
    else:
        what = f"vote {voted.args['votes']} counted" if voted else "already decided: nothing to do"
    challenge = str(piece["challenge_id"])[:16]
    chain.done(result, f"{who}, evidence {piece['evidence']} (challenge {challenge}…): {what}")
