"""The validator service: three background loops (watch → judge → vote) over one database, and the
HTTP API beside them. Each loop is its own thread and its own module; they meet only in SQL, so a
crash of any loop, or of the process, loses nothing that was recorded."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from intellect.identity import Wallet
from intellect.wire.verdicts import Verdict
from intellect.workloads import FileJudge
from ledger.client import LedgerClient
from validator.fetch import Fetcher
from validator.judging import JudgeLoop
from validator.settings import ValidatorSettings
from validator.slashing import QuorumVoter, VoteLoop, Voter
from validator.store import ChainCursor, Database, SqlSeenStore, Submissions, Verdicts, open_database
from validator.watcher import Watcher
from validator.windows import VoteWindows

log = structlog.get_logger(__name__)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.files = Counter("validator_files_total", "files judged", ["verdict"], registry=self.registry)
        self.rows = Counter("validator_rows_total", "rows judged", ["verdict"], registry=self.registry)
        self.tokens = Counter(
            "validator_tokens_total", "output tokens judged", ["verdict"], registry=self.registry
        )
        self.check_seconds = Histogram(
            "validator_check_seconds", "seconds per check", ["check"], registry=self.registry,
            buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60),
        )  # fmt: skip
        self.lag = Gauge(
            "validator_queue_lag_blocks",
            "chain head minus the next block to read",
            ["pool"],
            registry=self.registry,
        )
        self.pending = Gauge(
            "validator_pending_submissions", "submissions not judged yet", registry=self.registry
        )
        self.votes = Counter("validator_votes_total", "votes sent", registry=self.registry)

    def observe(self, verdict: Verdict) -> None:
        self.files.labels(verdict.verdict).inc()
        self.rows.labels(verdict.verdict).inc(verdict.rows)
        self.tokens.labels(verdict.verdict).inc(verdict.tokens)
        for check, seconds in verdict.timings.items():
            self.check_seconds.labels(check).observe(seconds)


class ObservedJudge:
    """Counts every verdict into the metrics on its way out."""

    def __init__(self, inner: FileJudge, metrics: Metrics) -> None:
        self.inner = inner
        self.metrics = metrics

    def judge(self, path: Path, submission):  # noqa: ANN001, ANN201
        verdict = self.inner.judge(path, submission)
        self.metrics.observe(verdict)
        return verdict


class ValidatorService:
    def __init__(
        self,
        settings: ValidatorSettings,
        wallet: Wallet,
        judge_factory: Callable[[SqlSeenStore], FileJudge],
        *,
        voter: Voter | None = None,
    ) -> None:
        self.settings = settings
        self.wallet = wallet
        self.client = LedgerClient(settings.rpc_url, settings.deployment, wallet)
        self.db = Database(open_database(settings.database_url, settings.data_dir))
        self.submissions = Submissions(self.db)
        self.verdicts = Verdicts(self.db)
        self.cursor = ChainCursor(self.db)
        self.metrics = Metrics()
        self.watcher = Watcher(
            self.client,
            self.db,
            settings.pool_ids,
            confirmations=settings.confirmations,
            step_url=settings.step_url,
        )
        fetcher = Fetcher(
            settings.orchestrator_url,
            wallet,
            settings.data_dir / "files",
            max_bytes=settings.max_file_bytes,
            timeout=settings.fetch_timeout_seconds,
        )
        judge = ObservedJudge(judge_factory(SqlSeenStore(self.db)), self.metrics)
        self.judging = JudgeLoop(
            self.submissions,
            self.verdicts,
            fetcher,
            judge,
            fetch_window=settings.fetch_window_seconds,
            vote=settings.vote,
            vote_window=VoteWindows(self.client).seconds,
            poison_limit=settings.judge_attempts,
            evidence_dir=settings.data_dir / "evidence",
        )
        self.voting = VoteLoop(self.verdicts, voter or QuorumVoter(self.client))
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: dict[str, str] = {}

    def _loop(self, name: str, step: Callable[[], int]) -> None:
        while not self._stop.is_set():
            try:
                busy = step()
                self.errors.pop(name, None)
            except Exception as exc:  # a loop never dies: it logs, waits and tries again
                self.errors[name] = f"{type(exc).__name__}: {exc}"
                log.exception("loop failed", loop=name)
                busy = 0
            if not busy:
                self._stop.wait(self.settings.poll_seconds)

    def _vote_step(self) -> int:
        sent = self.voting.run_once()
        self.metrics.votes.inc(sent)
        return sent

    def _watch_step(self) -> int:
        queued = self.watcher.poll()
        head = self.client.block_number()
        for pool in self.settings.pool_ids:
            self.metrics.lag.labels(str(pool)).set(max(0, head + 1 - self.cursor.next_block(pool, head + 1)))
        self.metrics.pending.set(self.submissions.pending_count())
        return queued

    def start(self) -> ValidatorService:
        for name, step in (
            ("watch", self._watch_step),
            ("judge", self.judging.run_once),
            ("vote", self._vote_step),
        ):
            thread = threading.Thread(
                target=self._loop, args=(name, step), name=f"validator-{name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        log.info("validator started", address=self.wallet.address, pools=self.settings.pool_ids)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))
