"""The watch loop: `WorkSubmitted` events of each pool, from a cursor persisted in SQL.

Every consumed block's hash is stored; before each read the newest stored hashes are compared with
the chain, and on a mismatch (a reorg) the cursor rewinds to the first replaced block and what was
read from the replaced blocks but not yet judged is forgotten, to be read again from the new chain.
Judged work keeps its verdict: the same work key is the same file, so it is never judged twice.
"""

from __future__ import annotations

import httpx
import structlog

from ledger.client import LedgerClient
from ledger.events import EventReader, WorkSubmittedEvent
from validator.store import ChainCursor, Database, SubmissionRow, Submissions

log = structlog.get_logger(__name__)

REORG_CHECK_DEPTH = 64  # newest stored block hashes compared with the chain on every pass
MAX_BLOCKS_PER_PASS = 500


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

    def trainer_step(self) -> int | None:
        if not self.step_url:
            return None
        try:
            step = httpx.get(self.step_url, timeout=5.0).json().get("step")
            return int(step) if isinstance(step, int) else None
        except (httpx.HTTPError, ValueError):
            return None

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
            step = self.trainer_step() if batch.events else None
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
                            trainer_step=step,
                        ),
                    )
                    queued += int(added)
                self.cursor.advance(s, pool_id, batch.next_block, hashes)
        return queued
