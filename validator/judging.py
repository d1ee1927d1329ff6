"""The judge loop: each queued submission is fetched, judged and its verdict recorded.

A file that cannot be fetched is retried with exponential backoff; once the fetch window since its
submission has passed it is soft-invalidated (no slash: the fault may be the storage's).
Accepted files are kept (the trainer reads them through `GET /accepted` → `GET /files/{sha256}`).
"""

from __future__ import annotations

import time

import structlog

from validator.fetch import Fetcher, FetchError
from validator.store import SubmissionRow, Submissions, Verdicts
from validator.verdicts import Judge, Submission, Verdict

log = structlog.get_logger(__name__)


class JudgeLoop:
    def __init__(
        self,
        submissions: Submissions,
        verdicts: Verdicts,
        fetcher: Fetcher,
        judge: Judge,
        *,
        fetch_window: float,
        vote: bool,
        base_delay: float = 2.0,
        max_delay: float = 300.0,
    ) -> None:
        self.submissions = submissions
        self.verdicts = verdicts
        self.fetcher = fetcher
        self.judge = judge
        self.fetch_window = fetch_window
        self.vote = vote
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.judged: list[Verdict] = []  # this process's verdicts (metrics)

    def run_once(self) -> int:
        done = 0
        for sub in self.submissions.due():
            self.handle(sub)
            done += 1
        return done

    def handle(self, sub: SubmissionRow) -> None:
        sha = sub.work_key.removeprefix("0x")
        try:
            path = self.fetcher.fetch(sha)
        except FetchError as exc:
            if time.time() - sub.submitted_at > self.fetch_window:
                verdict = Verdict(
                    file=sha, verdict="soft_invalidate",
                    reasons=[f"fetch: not retrievable within {self.fetch_window:.0f} s of submission: {exc}"],
                )  # fmt: skip
                self.verdicts.record(sub, verdict, sha, None, self.vote)
                log.warning("soft-invalidated unfetchable work", work_key=sub.work_key, error=str(exc))
                return
            attempts = sub.attempts + 1
            delay = min(self.max_delay, self.base_delay * 2 ** (attempts - 1))
            self.submissions.retry_later(sub.pool_id, sub.work_key, str(exc), delay)
            log.info(
                "fetch failed; retrying", work_key=sub.work_key, attempt=attempts, delay=delay, error=str(exc)
            )
            return
        submission = Submission(
            node=sub.node, pool_id=sub.pool_id, work_key=sub.work_key, work_units=sub.units,
            trainer_step=sub.trainer_step, block_number=sub.block_number, tx_hash=sub.tx_hash,
        )  # fmt: skip
        verdict = self.judge.judge(path, submission)
        kept = path if verdict.verdict == "accept" else None
        self.verdicts.record(sub, verdict, sha, kept, self.vote)
        if kept is None:
            path.unlink(missing_ok=True)
        self.judged.append(verdict)
        log.info(
            "judged",
            work_key=sub.work_key,
            node=sub.node,
            verdict=verdict.verdict,
            reasons=verdict.reasons,
            seconds=verdict.seconds,
        )
