"""`intellect-pool audit`: trace every payout of a node back to the work it pays and the verdicts on
that work (see `ledger.audit`), or a group batch to who served which layers and what each member was
paid (`--group FILE…`, see `ledger.group_audit`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from intellect.cli import out
from intellect.wire.receipts import ReceiptError
from ledger.audit import Audit, AuditedWork, Auditor
from ledger.cli_options import (
    Chain,
    address,
    fmt_tokens,
)
from ledger.errors import LedgerError
from ledger.group_audit import GroupAudit, GroupAuditor, MemberAudit


def _votes(w: AuditedWork) -> str:
    parts = [f"{v.verdict} by {v.validator[:10]}… tx {v.tx_hash}" for v in w.votes]
    parts += [
        f"{v.verdict} ({'; '.join(v.reasons)[:60] or 'no reason given'}) at {v.validator}" for v in w.verdicts
    ]
    return "\n".join(parts)


def _work_table(title: str, works: list[AuditedWork]) -> Table:
    table = Table(title=title)
    for col in ("work key", "units", "reward", "status", "submitted by tx", "votes and verdicts"):
        table.add_column(col, overflow="fold")
    for w in works:
        status = w.status + (f" (tx {w.dropped_tx})" if w.dropped_tx else "")
        table.add_row(w.work_key, str(w.units), fmt_tokens(w.reward), status, w.submitted_tx, _votes(w))
    return table


def audit(
    chain: Chain,
    node: Annotated[str | None, typer.Option("--node", help="the node whose payouts to trace")] = None,
    work_key: Annotated[
        str | None, typer.Option("--work-key", help="trace one work key (0x + 64 hex)")
    ] = None,
    group: Annotated[
        list[Path], typer.Option("--group", help="a member's file of a group batch (repeat for each member; "
                                 "files of several batches are audited batch by batch)")  # fmt: skip
    ] = [],  # noqa: B006
    validator_url: Annotated[
        list[str], typer.Option("--validator-url", help="validator API for verdict reasons (repeat)")
    ] = [],  # noqa: B006
) -> None:
    """For each payout: the work keys it pays, the tx that submitted each, the validators' votes and
    verdicts on it, and whether the paid amounts add up to what the chain minted. With --group: for each
    group batch, every member, the layers it served, the units its receipt states, and what the chain
    recorded and paid for its file."""
    if sum(given for given in (node is not None, work_key is not None, bool(group))) != 1:
        raise LedgerError("give exactly one of --node 0x…, --work-key 0x… or --group FILE…")
    auditor = Auditor(chain.reader(), validator_url)
    if group:
        try:
            found = GroupAuditor(auditor).audit(group)
        except (ReceiptError, ConnectionError) as exc:
            raise LedgerError(str(exc)) from None
        if chain.as_json:
            chain.emit(found)
        else:
            _print_groups(found)
        return
    try:
        if work_key is not None:
            if len(work_key.removeprefix("0x")) != 64:
                raise LedgerError(f"--work-key {work_key!r} is not 0x + 64 hex digits")
            result: Audit = auditor.work_key(work_key)[0]
            key = work_key.lower()
            result.payouts = [p for p in result.payouts if any(w.work_key == key for w in p.work)]
            for p in result.payouts:
                p.work = [w for w in p.work if w.work_key == key]
            result.unpaid = [w for w in result.unpaid if w.work_key == key]
        else:
            result = auditor.node(address(node or "", "node"))
    except (LookupError, ConnectionError) as exc:
        raise LedgerError(str(exc)) from None
    if chain.as_json:
        chain.emit(result)
        return
    for p in result.payouts:
        ok = "[green]reconciled[/green]" if p.reconciled else "[red]does NOT reconcile[/red]"
        out.print(
            f"payout tx {p.tx_hash} (block {p.block}): {fmt_tokens(p.amount)} tokens to {p.provider}, {ok}"
        )
        out.print(_work_table(f"work paid by {p.tx_hash[:12]}…", p.work))
    if result.unpaid:
        out.print(
            _work_table(f"work of {result.node} not paid (locked, dropped or still claimable)", result.unpaid)
        )
    if not result.payouts and not result.unpaid:
        out.print(f"no work recorded for {result.node}")
    for note in result.notes:
        out.print(f"[yellow]note:[/yellow] {note}")


def _member_row(m: MemberAudit) -> list[str]:
    chain = ""
    if m.units_on_chain is not None:
        chain = f"{m.units_on_chain} units, {fmt_tokens(m.reward or 0)} locked"
    status = m.status + (f" (tx {m.paid_tx})" if m.paid_tx else "")
    votes = [f"{v.verdict} by {v.validator[:10]}…" for v in m.votes]
    votes += [f"{v.verdict} ({'; '.join(v.reasons)[:60] or 'no reason given'})" for v in m.verdicts]
    return [str(m.stage), m.node, f"{m.layers[0]}–{m.layers[1] - 1}", str(m.units), m.work_key or "",
            chain, status, fmt_tokens(m.paid), "\n".join(votes)]  # fmt: skip


def _print_groups(found: GroupAudit) -> None:
    for b in found.batches:
        table = Table(title=f"task {b.task_id} · group {b.group_id} · batch {b.batch}: {b.output_tokens} "
                      f"tokens through {b.model_layers} layers of {b.model}")  # fmt: skip
        for col in ("stage", "node", "layers", "units", "work key", "on chain", "status", "paid",
                    "votes and verdicts"):  # fmt: skip
            table.add_column(col, overflow="fold")
        for m in b.members:
            table.add_row(*_member_row(m))
        out.print(table)
        out.print(f"paid for this batch: {fmt_tokens(b.paid)} tokens")
        for problem in b.problems:
            out.print(f"[red]problem:[/red] {problem}")
    for note in found.notes:
        out.print(f"[yellow]note:[/yellow] {note}")
