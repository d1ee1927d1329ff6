"""The judge loop: each queued submission is fetched, judged and its verdict recorded.

A file that cannot be fetched is retried with exponential backoff, and judged by why (docs/validator.md,
"Data availability"):
- **missing** (`FileMissing`: the orchestrator has no completed upload) for longer than the
  availability window after its submission → `invalidate` ("data availability: ..."), voted and
  slashed like any bad file. An honest worker uploads before it submits, so the window only has to
  cover storage propagation and retries; it is the smaller of the setting and a third of the pool's
  voting window, so the quorum's votes land before the deadline.
- **unreachable** (`StorageUnreachable`: storage or the orchestrator down, this validator refused)
  → never invalidated. If it is still unreachable when the voting deadline comes near (the last sixth
  of the window, at least 30 s), the work is soft-invalidated: not paid (nobody could judge it), not
  slashed, and the pool's owner may pardon it while its reward is still locked.
Accepted files are kept (the trainer reads them through `GET /accepted` → `GET /files/{sha256}`).
Rejected ones are kept as evidence (`<data dir>/evidence/<sha256>.parquet`, the newest
`EVIDENCE_KEPT`): a slash or an unpaid file can be looked at again by the pool owner, and an honest
file a limit rejected becomes test data (as tests/workloads/judge/data/demo-near-tie).

Downloads overlap judging: while one file is judged (CPU: the prefill), the next `prefetch` files of
the pass are fetched on a thread pool, so a validator whose storage is far away spends its time
judging, not waiting. The order of verdicts is unchanged (files are judged in chain order).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import structlog

from intellect.wire.verdicts import Submission, Verdict
from intellect.workloads import FileJudge
from validator.fetch import Fetcher, FetchError, FileMissing, FileTooLarge
from validator.store import UNFETCHED, SubmissionRow, Submissions, Verdicts
from validator.tasks import TaskUnreachable

log = structlog.get_logger(__name__)

PASS_LIMIT = 64  # files judged in one pass of the loop at most
EVIDENCE_KEPT = 256  # rejected files kept (each within the file-size cap): the newest first


class JudgeLoop:
    def __init__(
        self,
        submissions: Submissions,
        verdicts: Verdicts,
        fetcher: Fetcher,
        judge: FileJudge,
        *,
        fetch_window: float,
        vote: bool,
        vote_window: Callable[[int], float] | None = None,
        base_delay: float = 2.0,
        max_delay: float = 300.0,
        poison_limit: int = 5,
        prefetch: int = 2,
        evidence_dir: Path | None = None,
    ) -> None:
        self.submissions = submissions
        self.verdicts = verdicts
        self.fetcher = fetcher
        self.judge = judge
        self.fetch_window = fetch_window  # the availability window (setting)
        self.vote = vote
        self.vote_window = vote_window  # pool id -> seconds validators may vote after a submission
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.poison_limit = poison_limit
        self.prefetch = prefetch
        self.evidence_dir = evidence_dir
        self.judged: list[Verdict] = []  # this process's verdicts (metrics)

    def run_once(self) -> int:
        """FileJudge what is due, each file at most once a pass. `due` holds a node's file until its earlier
        ones have verdicts, so it is asked again after each round: a node's backlog is judged in one
        pass, not one file per pass (up to `PASS_LIMIT`, so a stop request is seen between passes)."""
        handled: set[tuple[int, str]] = set()
        downloads: dict[str, Future[Path]] = {}
        pool = ThreadPoolExecutor(max_workers=max(1, self.prefetch), thread_name_prefix="prefetch")
        try:
            while len(handled) < PASS_LIMIT:
                fresh = [sub for sub in self.submissions.due() if (sub.pool_id, sub.work_key) not in handled]
                if not fresh:
                    break
                # what comes next in chain order, whoever's it is (a node's later files are not due yet)
                upcoming = [r.work_key.removeprefix("0x") for r in self.submissions.upcoming(PASS_LIMIT)]
                for sub in fresh:
                    sha = sub.work_key.removeprefix("0x")
                    ahead = [k for k in upcoming if k != sha and k not in downloads][: self.prefetch]
                    for key in [sha, *ahead]:
                        if key not in downloads:
                            downloads[key] = pool.submit(self.fetcher.fetch, key)
                    handled.add((sub.pool_id, sub.work_key))
                    self.handle(sub, downloads.pop(sha))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # files fetched ahead stay for the next pass
        return len(handled)

    def handle(self, sub: SubmissionRow, download: Future[Path] | None = None) -> None:
        sha = sub.work_key.removeprefix("0x")
        try:
            path = download.result() if download is not None else self.fetcher.fetch(sha)
        except FetchError as exc:
            verdict = self._unfetched(sub, sha, exc)
            if verdict is not None:
                self.verdicts.record(sub, verdict, sha, None, self.vote)
                log.warning("judged unfetchable work", work_key=sub.work_key, verdict=verdict.verdict,
                            reason=verdict.reasons[0])  # fmt: skip
                return
            self._retry(sub, f"fetch: {exc}")
            return
        submission = Submission(
            node=sub.node, pool_id=sub.pool_id, work_key=sub.work_key, work_units=sub.units,
            trainer_step=sub.trainer_step, trainer_step_before=sub.trainer_step_before,
            block_number=sub.block_number, tx_hash=sub.tx_hash,
            counters_unknown=self.submissions.unread_before(sub),
        )  # fmt: skip
        try:
            verdict = self.judge.judge(path, submission)
        except TaskUnreachable as exc:  # the orchestrator is down: not the file's fault, try later
            self._retry(sub, f"task: {exc}")
            return
        except Exception as exc:  # a file our checks choke on must not block the files behind it
            log.exception("judging failed", work_key=sub.work_key, attempt=sub.attempts + 1)
            if sub.attempts + 1 < self.poison_limit:
                self._retry(sub, f"judging failed: {type(exc).__name__}: {exc}")
                return
            verdict = Verdict(file=sha, verdict="soft_invalidate", reasons=[
                f"the validator could not judge this file in {self.poison_limit} attempts "
                f"({type(exc).__name__}: {str(exc)[:300]}); not paid, not slashed"
            ])  # fmt: skip
        kept = path if verdict.verdict == "accept" else None
        self.verdicts.record(sub, verdict, sha, kept, self.vote)
        if kept is None:
            self._keep_evidence(path, sha)
        self.judged.append(verdict)
        log.info(
            "judged",
            work_key=sub.work_key,
            node=sub.node,
            verdict=verdict.verdict,
            reasons=verdict.reasons,
            seconds=verdict.seconds,
        )

    def _keep_evidence(self, path: Path, sha: str) -> None:
        """The rejected file moved to the evidence folder (its oldest files pruned), or deleted."""
        if self.evidence_dir is None or not path.is_file():
            path.unlink(missing_ok=True)
            return
        self.evidence_dir.mkdir(parents=True, exist_ok=True)
        path.replace(self.evidence_dir / f"{sha}.parquet")
        kept = sorted(self.evidence_dir.glob("*.parquet"), key=lambda p: p.stat().st_mtime)
        for old in kept[:-EVIDENCE_KEPT]:
            old.unlink(missing_ok=True)

    def _retry(self, sub: SubmissionRow, error: str) -> None:
        """Back off exponentially, but never past the next point where this file gets a verdict."""
        attempts = sub.attempts + 1
        delay = min(self.max_delay, self.base_delay * 2 ** (attempts - 1))
        age = time.time() - sub.submitted_at
        upcoming = [t - age for t in self.windows(sub.pool_id) if t > age]
        if upcoming:
            delay = max(1.0, min(delay, min(upcoming) + 1.0))
        self.submissions.retry_later(sub.pool_id, sub.work_key, error, delay)
        log.info("not judged yet; retrying", work_key=sub.work_key, attempt=attempts, delay=delay,
                 error=error)  # fmt: skip

    def windows(self, pool_id: int) -> tuple[float, float]:
        """(availability window, soft-invalidation point) in seconds after a submission."""
        if self.vote_window is None:
            return self.fetch_window, self.fetch_window
        voting = float(self.vote_window(pool_id))
        return min(self.fetch_window, voting / 3), voting - max(30.0, voting / 6)

    def _unfetched(self, sub: SubmissionRow, sha: str, exc: FetchError) -> Verdict | None:
        """The verdict on a file that could not be fetched, or None to try again later."""
        age = time.time() - sub.submitted_at
        available, soft_at = self.windows(sub.pool_id)
        if isinstance(exc, FileMissing) and age > available:
            return Verdict(file=sha, verdict="invalidate", reasons=[
                f"data availability: the file was still not in the pool's storage {age:.0f} s after its "
                f"submission (an honest node uploads before it submits; allowed: {available:.0f} s): {exc}"
            ])  # fmt: skip
        if isinstance(exc, FileTooLarge):  # the node's file, whatever the storage: no retry changes it
            return Verdict(file=sha, verdict="soft_invalidate", reasons=[
                f"size: {exc}; this validator does not read it (not paid, not slashed; its counter is used, "
                "so the node's next file is held as after a withheld batch)"
            ])  # fmt: skip
        if not isinstance(exc, FileMissing) and age > soft_at:
            return Verdict(file=sha, verdict="soft_invalidate", reasons=[
                f"{UNFETCHED} storage unreachable until {age:.0f} s after submission, near the end of the "
                f"voting window; not paid and not slashed (the pool owner may pardon it): {exc}"
            ])  # fmt: skip
        return None
