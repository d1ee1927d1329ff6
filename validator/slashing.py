"""The vote loop: verdicts that reject work are sent to the ledger, exactly once per work key.

`Voter` is the seam: `QuorumVoter` votes under the pool's k-of-n slashing policy (the k-th vote
slashes, ejects and drops rewards in one transaction; a pool with no policy has a quorum of 1), the one
the service uses unless it is given another. A validator deciding alone with the global role's
`invalidateWork` is the pool owner's emergency tool, `intellect-pool invalidate`, not a voter. A revert
saying the work is already decided counts as done: votes are idempotent, so a restart or a reorg may
safely send one again.
"""

from __future__ import annotations

from typing import Protocol

import structlog

from ledger.client import LedgerClient
from ledger.errors import ContractRevert, LedgerError
from validator.store import Verdicts

log = structlog.get_logger(__name__)

# Reverts that mean "nothing left to do for this work key".
SETTLED = {"WorkNotFound", "AlreadyVoted", "WorkAlreadyInvalidated"}


class Voter(Protocol):
    def invalidate(self, pool_id: int, work_key: str) -> str: ...

    def soft_invalidate(self, pool_id: int, work_key: str) -> str: ...


class QuorumVoter:
    """A vote under the pool's slashing policy (or, without one, as a global validator with quorum 1)."""

    def __init__(self, client: LedgerClient) -> None:
        self.client = client

    def invalidate(self, pool_id: int, work_key: str) -> str:
        return self.client.slashing.vote_invalidate(pool_id, work_key).tx_hash

    def soft_invalidate(self, pool_id: int, work_key: str) -> str:
        return self.client.slashing.vote_soft_invalidate(pool_id, work_key).tx_hash


class VoteLoop:
    def __init__(self, verdicts: Verdicts, voter: Voter) -> None:
        self.verdicts = verdicts
        self.voter = voter
        self.sent = 0

    def run_once(self) -> int:
        done = 0
        for row in self.verdicts.votes_due():
            send = self.voter.invalidate if row.verdict == "invalidate" else self.voter.soft_invalidate
            try:
                tx = send(row.pool_id, row.work_key)
            except ContractRevert as exc:
                if exc.error_name in SETTLED:
                    self.verdicts.vote_done(row.id, None)
                    log.info("vote not needed", work_key=row.work_key, why=exc.error_name)
                else:
                    self.verdicts.vote_done(row.id, None, error=str(exc))
                    log.error("vote refused", work_key=row.work_key, error=str(exc))
                continue
            except LedgerError as exc:  # RPC trouble: stays pending, retried next pass
                log.warning("vote not sent yet", work_key=row.work_key, error=str(exc))
                continue
            self.verdicts.vote_done(row.id, tx)
            self.sent += 1
            done += 1
            log.info("voted", verdict=row.verdict, work_key=row.work_key, node=row.node, tx=tx)
        return done
