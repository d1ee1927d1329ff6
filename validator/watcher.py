"""The watch loop: `WorkSubmitted` events of each pool, from a cursor persisted in SQL.

Every consumed block's hash is stored; before each read the newest stored hashes are compared with
the chain, and on a mismatch (a reorg) the cursor rewinds to the first replaced block and what was
read from the replaced blocks but not yet judged is forgotten, to be read again from the new chain.
Judged work keeps its verdict: the same work key is the same file, so it is never judged twice.
"""

from __future__ import annotations

import httpx
import structlog

from intellect.http_client import shared as http_client
from ledger.client import LedgerClient
from ledger.events import EventReader, WorkSubmittedEvent
from validator.store import ChainCursor, Database, SubmissionRow, Submissions

log = structlog.get_logger(__name__)

REORG_CHECK_DEPTH = 64  # newest stored block hashes compared with the chain on every pass
MAX_BLOCKS_PER_PASS = 500
# How far the chain's block time and the trainer's clock may differ (seconds): "behind the window" is
# judged against the trainer's step in force this long before the block's time (the lenient side).
CLOCK_GRACE_SECONDS = 30


def trainer_step(step_url: str, at: float | None = None) -> int | None:
    """The trainer's step now, or in force at unix time `at` (`GET /step?at=`; a trainer older than
    that answers with the step now: later, so it can only make an honest file look stale, never
    ahead). None when the trainer cannot be read."""
    try:
        params = {} if at is None else {"at": max(0.0, at)}
        step = http_client().get(step_url, params=params, timeout=5.0).json().get("step")
        return int(step) if isinstance(step, int) else None
    except (httpx.HTTPError, ValueError):
        return None


def steps_at_submission(
    step_url: str | None, block_times: set[int]
) -> tuple[int | None, dict[int, int | None]]:
    """The steps the trainer may have been at when blocks of these times were made: (latest, earliest
    by block time). latest: the step now, never less than the step at submission whatever the clocks
    say ("ahead of the trainer" slashes, so it is judged on a bound no clock skew between the chain
    and the trainer can lower). earliest: the step in force at the block's time less
    `CLOCK_GRACE_SECONDS`, from the trainer's history, so the same whenever a validator gets to the
    block (late, or after a restart): an honest file is never unpaid as "behind" because its validator
    lagged."""
    latest = trainer_step(step_url) if step_url and block_times else None
    if step_url is None or latest is None:
        return None, dict.fromkeys(block_times)
    return latest, {t: trainer_step(step_url, t - CLOCK_GRACE_SECONDS) for t in block_times}


class Watcher:
    def __init__(
        self,
        client: LedgerClient,
        db: Database,
        pool_ids: list[int],
        *,
        confirmations: int = 0,
        step_url: str | None = None,
    ) -> None:
        self.client = client
        self.db = db
        self.cursor = ChainCursor(db)
        self.submissions = Submissions(db)
        self.pool_ids = pool_ids
        self.step_url = step_url
        self.readers = {
            pool: EventReader(
                client, confirmations, pool_id=pool, kinds=("WorkSubmitted",), max_range=MAX_BLOCKS_PER_PASS
            )
            for pool in pool_ids
        }
        self.reorgs = 0

    def block_hash(self, number: int) -> str:
        return "0x" + bytes(self.client.w3.eth.get_block(number)["hash"]).hex()

    def check_reorg(self, pool_id: int) -> int | None:
        """The first block whose stored hash the chain no longer has, or None."""
        first_bad: int | None = None
        for number, stored in self.cursor.recent_blocks(pool_id)[:REORG_CHECK_DEPTH]:  # newest first
            try:
                current = self.block_hash(number)
            except Exception:  # the chain is shorter now: that block is gone
                current = ""
            if current == stored:
                break
            first_bad = number
        return first_bad

    def poll(self) -> int:
        """One pass over every pool; returns how many new submissions were queued."""
        queued = 0
        for pool_id in self.pool_ids:
            bad = self.check_reorg(pool_id)
            if bad is not None:
                self.reorgs += 1
                log.warning("reorg: rewinding", pool=pool_id, from_block=bad)
                self.cursor.rewind(pool_id, bad)
            reader = self.readers[pool_id]
            start = self.cursor.next_block(pool_id, self.client.deployment.block)
            batch = reader.read(start, start + MAX_BLOCKS_PER_PASS - 1)
            if batch.to_block < batch.from_block:
                continue
            hashes = {
                n: self.block_hash(n)
                for n in range(
                    max(batch.from_block, batch.to_block - REORG_CHECK_DEPTH + 1), batch.to_block + 1
                )
            }
            latest, earliest = steps_at_submission(
                self.step_url, {e.timestamp for e in batch.events if isinstance(e, WorkSubmittedEvent)})
            with self.db.transaction() as s:
                for event in batch.events:
                    assert isinstance(event, WorkSubmittedEvent)
                    added = self.submissions.add(
                        s,
                        SubmissionRow(
                            pool_id=pool_id,
                            work_key=event.work_key.lower(),
                            node=event.node,
                            provider=event.provider,
                            units=event.units,
                            block_number=event.block_number,
                            log_index=event.log_index,
                            leaf=event.leaf,
                            tx_hash=event.tx_hash,
                            submitted_at=event.timestamp,
                            trainer_step=latest,
                            trainer_step_before=earliest[event.timestamp],
                        ),
                    )
                    queued += int(added)
                self.cursor.advance(s, pool_id, batch.next_block, hashes)
        return queued
