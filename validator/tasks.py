"""Each submitted file is judged by the task it belongs to, with that task's workload plug-in.

The chain records only (node, work key, units); which task a file belongs to is in the orchestrator's
upload record, which the node signed when it asked to upload that file for that task. The fetch of
the file already read that record (`GET /storage/files/{sha256}`, validator/records.py), so the task
id is known without another call; the task itself is `GET /tasks/{id}?include_deleted=true`, once
per task: tasks never change once created, so they are cached by id.

What can be pinned on the node is judged; what cannot never slashes:
- the orchestrator cannot be reached → the file waits and is judged later (`TaskUnreachable`);
- the orchestrator has no task for it → `soft_invalidate` with the reason;
- the task names no workload, or one this validator has no plug-in for, or settings the plug-in
  refuses → `soft_invalidate` (the fault is the trainer's or the validator's, not the node's);
- otherwise the plug-in's checks decide (a file that breaks its own task's rules is `invalidate`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from pathlib import Path

import structlog

from intellect.client import TaskApiError
from intellect.identity import Wallet
from intellect.wire.tasks import Task
from intellect.wire.verdicts import Submission, Verdict
from intellect.workloads import FileJudge, ValidatorEnv, WorkloadError, settings_for
from validator.records import for_orchestrator

log = structlog.get_logger(__name__)


class TaskUnknown(Exception):
    """The orchestrator has no (readable) task for the file; the reason says why (never grounds for a
    slash)."""


class TaskUnreachable(Exception):
    """The orchestrator could not be asked right now: the file is judged again later (the judge loop
    retries what raises)."""


class TaskBook:
    """Which task a file belongs to, learned from the orchestrator and cached."""

    def __init__(self, orchestrator_url: str, wallet: Wallet, *, timeout: float = 30.0, cached: int = 256):
        self.url = orchestrator_url.rstrip("/")
        self.records = for_orchestrator(self.url, wallet, timeout)
        self.cached = cached
        self._tasks: OrderedDict[str, Task] = OrderedDict()
        self._lock = threading.Lock()

    def task_of(self, work_key: str) -> Task:
        sha = work_key.lower().removeprefix("0x")
        try:
            task_id = self.records.task_id(sha)
        except TaskApiError as exc:
            if _unreachable(exc):
                raise TaskUnreachable(f"orchestrator {self.url}: {exc}") from None
            raise TaskUnknown(f"the orchestrator has no task for file {sha[:16]}… ({exc.status}: "
                              f"{exc.reason[:300]})") from None  # fmt: skip
        except ValueError as exc:
            raise TaskUnknown(f"the orchestrator's record of file {sha[:16]}… is no file record ({exc})"
                              ) from None
        return self.task(task_id)

    def task(self, task_id: str) -> Task:
        with self._lock:
            if task_id in self._tasks:
                self._tasks.move_to_end(task_id)
                return self._tasks[task_id]
        try:
            task = self.records.task(task_id)
        except TaskApiError as exc:
            if _unreachable(exc):
                raise TaskUnreachable(f"orchestrator {self.url}: {exc}") from None
            reason = f"{exc.status}: {exc.reason[:300]}"
            raise TaskUnknown(f"task {task_id} could not be read ({reason})") from None
        except ValueError as exc:
            raise TaskUnknown(f"task {task_id}: the orchestrator's record is not a task ({exc})") from None
        with self._lock:
            self._tasks[task_id] = task
            while len(self._tasks) > self.cached:
                self._tasks.popitem(last=False)
        return task


def _unreachable(exc: TaskApiError) -> bool:
    """No answer, or the orchestrator failing: the file waits (never a verdict on the node)."""
    return exc.status == 0 or exc.status >= 500


class TaskJudge:
    """A `Judge` that hands each file to its own task's plug-in. A plug-in's judge holds models, so
    only the `kept` most recently used tasks keep theirs."""

    def __init__(self, book: TaskBook, env: ValidatorEnv, *, kept: int = 4) -> None:
        self.book = book
        self.env = env
        self.kept = max(1, kept)
        self._judges: OrderedDict[str, FileJudge] = OrderedDict()

    def judge_for(self, task: Task) -> FileJudge:
        key = f"{task.id}:{task.spec.config_hash()}"
        if key in self._judges:
            self._judges.move_to_end(key)
            return self._judges[key]
        plugin, settings = settings_for(task.spec)
        judge = plugin.file_judge(settings, dataclasses.replace(self.env, task_id=task.id))
        self._judges[key] = judge
        while len(self._judges) > self.kept:
            self._judges.popitem(last=False)
        return judge

    def judge(self, path: Path, submission: Submission) -> Verdict:
        def soft(reason: str) -> Verdict:
            log.warning("file not judged by its task", work_key=submission.work_key, reason=reason)
            return Verdict(file=str(path), verdict="soft_invalidate", reasons=[reason])

        if not submission.work_key:
            return soft("task: the submission has no work key to find its task by")
        try:
            task = self.book.task_of(submission.work_key)
        except TaskUnknown as exc:
            return soft(f"task: {exc}")
        try:
            judge = self.judge_for(task)
        except WorkloadError as exc:
            return soft(f"task {task.id}: {exc}; this validator cannot judge its files")
        return judge.judge(path, submission)
