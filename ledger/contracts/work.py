"""`ComputePool`, work side: submitting work, invalidating it (alone or by quorum, see
`ledger/contracts/slashing.py`), reading it back, the rewards it earns and the parameters that price it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eth_utils import to_checksum_address

from ledger.contracts.base import ContractBase, struct
from ledger.contracts.slashing import Slashing, work_key_bytes
from ledger.errors import LedgerError
from ledger.merkle import BatchTree
from ledger.models import BatchRecord, TxResult, WorkParameters, WorkRecord, WorkStatus

# The struct getWork and getWorkSince return (`status` is a WorkStatus, which the model converts to).
_WORK = "work_key provider node units reward timestamp status"


def _work(pool_id: int, t: Sequence[Any]) -> WorkRecord:
    record = struct(_WORK, t)
    record["work_key"] = "0x" + bytes(record["work_key"]).hex()
    return WorkRecord(pool_id=pool_id, **record)


class WorkContract(ContractBase):
    def submit_work(self, pool_id: int, node: str, work_key: bytes | str, units: int) -> TxResult:
        return self._tx(
            self.pools, "submitWork", pool_id, to_checksum_address(node), work_key_bytes(work_key), units
        )

    def submit_work_batch(
        self, pool_id: int, node: str, files: Sequence[tuple[bytes | str, int]]
    ) -> TxResult:
        """Record many files in one transaction, in the order given (validators judge them in it).
        The root is built here (`ledger/merkle.py`) and rebuilt by the contract, which refuses a
        mismatch; every key must be new to the pool."""
        leaves = [(work_key_bytes(k), int(u)) for k, u in files]
        tree = BatchTree.of(leaves)
        return self._tx(
            self.pools, "submitWorkBatch", pool_id, to_checksum_address(node), tree.root,
            [k for k, _ in leaves], [u for _, u in leaves],
        )  # fmt: skip

    def batch_count(self, pool_id: int) -> int:
        return int(self._call(self.pools, "batchCount", pool_id))

    def get_batch(self, pool_id: int, batch_index: int) -> BatchRecord:
        t = self._call(self.pools, "getBatch", pool_id, batch_index)
        record = struct("root provider timestamp count node live_units lock_index", t)
        record["root"] = "0x" + bytes(record["root"]).hex()
        return BatchRecord(pool_id=pool_id, index=batch_index, **record)

    def verify_batch_leaf(
        self, pool_id: int, batch_index: int, work_key: bytes | str, units: int, proof: Sequence[bytes]
    ) -> bool:
        return bool(
            self._call(self.pools, "verifyBatchLeaf", pool_id, batch_index, work_key_bytes(work_key), units,
                       list(proof))  # fmt: skip
        )

    @property
    def slashing(self) -> Slashing:
        """Quorum slashing: policy, pool validators, votes, pardon (see ledger/contracts/slashing.py)."""
        return Slashing(self)

    def invalidate_work(self, pool_id: int, work_key: bytes | str) -> TxResult:
        return self._tx(self.pools, "invalidateWork", pool_id, work_key_bytes(work_key))

    def soft_invalidate_work(self, pool_id: int, work_key: bytes | str) -> TxResult:
        return self._tx(self.pools, "softInvalidateWork", pool_id, work_key_bytes(work_key))

    def get_work(self, pool_id: int, work_key: bytes | str) -> WorkRecord | None:
        key = work_key_bytes(work_key)
        try:
            return _work(pool_id, self._call(self.pools, "getWork", pool_id, key))
        except LedgerError as exc:
            if getattr(exc, "error_name", "") == "WorkNotFound":
                return None
            raise

    def work_count(self, pool_id: int) -> int:
        return int(self._call(self.pools, "workCount", pool_id))

    def file_count(self, pool_id: int) -> int:
        """Files on chain in the pool: single submissions and every file of every batch."""
        batches = sum(self.get_batch(pool_id, i).count for i in range(self.batch_count(pool_id)))
        return self.work_count(pool_id) + batches

    def work_since(self, pool_id: int, since_ts: int = 0, page_size: int = 500) -> list[WorkRecord]:
        """Accepted (not invalidated) work submitted at or after `since_ts`, oldest first: single
        submissions paged from the contract, files of batches from their events (a batch stores no list
        of its keys), each read back with `getWork` for its status and reward."""
        out: list[WorkRecord] = []
        cursor = 0
        total = self.work_count(pool_id)
        while total:
            items, nxt = self._call(self.pools, "getWorkSince", pool_id, since_ts, cursor, page_size)
            out.extend(_work(pool_id, t) for t in items)
            if nxt >= total or nxt == cursor:
                break
            cursor = nxt
        if self.batch_count(pool_id):
            logs = self.pools.events.WorkBatchSubmitted().get_logs(
                from_block=self.deployment.block, argument_filters={"poolId": pool_id}
            )
            for log in sorted(logs, key=lambda entry: (entry["blockNumber"], entry["logIndex"])):
                if log["args"]["timestamp"] < since_ts:
                    continue
                for key in log["args"]["workKeys"]:
                    record = self.get_work(pool_id, bytes(key))
                    if record is not None and record.status is WorkStatus.SUBMITTED:
                        out.append(record)
            out.sort(key=lambda r: r.timestamp)  # stable: each source is in chain order already
        return out

    # ---- rewards ----

    def pending_rewards(self, node: str) -> int:
        """Rewards still inside the lock window (lost if the node's work is invalidated)."""
        return int(self._call(self.pools, "pendingRewards", to_checksum_address(node)))

    def claimable_rewards(self, node: str) -> int:
        return int(self._call(self.pools, "claimableRewards", to_checksum_address(node)))

    def claim_rewards(self, node: str) -> TxResult:
        """Mint the node's matured rewards to its provider."""
        return self._tx(self.pools, "claimRewards", to_checksum_address(node))

    def work_parameters(self) -> WorkParameters:
        return WorkParameters(
            reward_per_unit=self._call(self.pools, "rewardPerUnit"),
            reward_lock_period=self._call(self.pools, "rewardLockPeriod"),
            invalidation_window=self._call(self.pools, "invalidationWindow"),
            slash_penalty=self._call(self.pools, "slashPenalty"),
            whitelist_required=self._call(self.pools, "whitelistRequired"),
        )

    def set_work_parameters(
        self, reward_per_unit: int, reward_lock_period: int, invalidation_window: int, slash_penalty: int
    ) -> TxResult:
        return self._tx(
            self.pools,
            "setParameters",
            reward_per_unit,
            reward_lock_period,
            invalidation_window,
            slash_penalty,
        )

    def set_whitelist_required(self, required: bool) -> TxResult:
        return self._tx(self.pools, "setWhitelistRequired", required)
