"""Members whose task failed for good: which groups they break, and which nodes sit out a task for a while.

Why this exists: a member's worker keeps heartbeating (Healthy) after its task failed, so the
member-lost rule never fires and the other members wait on it for good. The worker already tells the
two cases apart (worker/runtime): a run that exits while restarts remain is reported `restarting`;
`failed` means the restart budget is spent, or the task could not start at all (a template, mount,
image or launch error), and the worker does not start that run again by itself. So `failed` is the
signal, and `restarting` (or `unknown`: the runtime could not be asked) breaks nothing.

The rule, read from the assignment rows the heartbeat writes (one per node and task):
- a group whose member's assignment for the group's task is `failed`, reported since the group was
  formed, is dissolved; an older `failed` row belongs to a run of an earlier group (the worker starts
  a new run for every new placement) and says nothing about this one;
- a node whose assignment for a task is `failed` and was reported less than the cooldown ago is not
  put in a group for that task. Without it the next pass would form the same group again and it would
  fail again. A cooldown rather than "until it reports the task otherwise": once out of its group the
  node is not handed the task any more, so it never reports it again and would be shut out for good,
  while what failed (a full disk, a registry outage, a bad driver) is often mended in minutes. The
  node stays free for other tasks meanwhile; the other members are free at once and regroup with
  someone else.

Limits: a status names the task, not the group, so a member whose own run also failed for good (its
restarts spent on the lost peer) before the pass that dissolves the group is taken for a failed one
too and sits out one cooldown; the first failure dissolves the group within a heartbeat and a pass,
well inside a pipeline peer's timeout, so this is rare.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from intellect.wire.tasks import TaskState
from orchestrator.models import AssignmentRow, GroupMemberRow, NodeGroupRow

# Default of `group_failed_cooldown_seconds`: long enough that a node failing on every start costs its
# partners one short-lived group per ten minutes, short enough that a mended node is back soon.
FAILED_COOLDOWN_SECONDS = 600.0
MAX_DETAIL_CHARS = 300  # the error goes into the audit log and the log line: its head is enough


Failed = dict[tuple[str, str], AssignmentRow]  # (task id, node address) → its `failed` assignment


def failed_assignments(session: Session, task_ids: Iterable[str]) -> Failed:
    """The `failed` assignments for these tasks (the live group tasks), in one query per pass: a
    query per group would cost thousands per pass in a large pool."""
    rows = session.scalars(select(AssignmentRow).where(AssignmentRow.state == TaskState.FAILED.value,
                                                       AssignmentRow.task_id.in_(list(task_ids))))
    return {(row.task_id, row.node_address): row for row in rows}


def failed_members(group: NodeGroupRow, members: Iterable[GroupMemberRow], failed: Failed) -> str | None:
    """Why `group` must go because members' tasks failed for good (None: no member failed), naming
    each failed member and its error. Only failures reported since the group was formed count."""
    if group.task_id is None:
        return None
    rows = [row for m in members if (row := failed.get((group.task_id, m.node_address))) is not None
            and row.updated_at >= group.created_at]
    reasons = [f"{row.node_address} task {row.task_id} failed: {_short(row.detail)}" for row in rows]
    return "member failed: " + "; ".join(reasons) if reasons else None


def recently_failed(failed: Failed, cooldown_seconds: float, now: datetime) -> dict[str, set[str]]:
    """Task id → nodes whose task failed for good less than `cooldown_seconds` before `now`: they are
    not grouped for that task until then."""
    since = now - timedelta(seconds=cooldown_seconds)
    found: dict[str, set[str]] = {}
    for (task_id, address), row in failed.items():
        if row.updated_at > since:
            found.setdefault(task_id, set()).add(address)
    return found


def _short(detail: str | None) -> str:
    if not detail:
        return "no detail reported"
    return detail if len(detail) <= MAX_DETAIL_CHARS else detail[: MAX_DETAIL_CHARS - 1] + "…"
