"""`ComputePool`, membership side: creating, starting and ending pools, and which nodes are in
them (invite joins, leaving, ejection, pool blacklists). The work done inside a pool is `work.py`:
same contract, but a different caller (workers and validators rather than the pool's manager)."""

from __future__ import annotations

from eth_utils import to_checksum_address

from ledger.contracts.base import ContractBase, struct
from ledger.errors import LedgerError
from ledger.invites import Invite
from ledger.models import Pool, TxResult

# The struct getPool returns (`status` is a PoolStatus, which the model converts to).
_POOL = (
    "id domain_id creator manager name data_uri compute_limit total_compute_units status"
    " created_at started_at ended_at"
)


class PoolsContract(ContractBase):
    def create_pool(
        self, domain_id: int, manager: str, name: str, data_uri: str = "", compute_limit: int = 0
    ) -> int:
        result = self._tx(
            self.pools, "createPool", domain_id, to_checksum_address(manager), name, data_uri, compute_limit
        )
        return self._created_id(result, "PoolCreated", "poolId")

    def start_pool(self, pool_id: int) -> TxResult:
        return self._tx(self.pools, "startPool", pool_id)

    def end_pool(self, pool_id: int) -> TxResult:
        return self._tx(self.pools, "endPool", pool_id)

    def get_pool(self, pool_id: int) -> Pool:
        return Pool(**struct(_POOL, self._call(self.pools, "getPool", pool_id)))

    def pool_count(self) -> int:
        return int(self._call(self.pools, "poolCount"))

    def pool_nodes(self, pool_id: int) -> list[str]:
        return list(self._call(self.pools, "getPoolNodes", pool_id))

    def is_node_in_pool(self, pool_id: int, node: str) -> bool:
        return bool(self._call(self.pools, "isNodeInPool", pool_id, to_checksum_address(node)))

    def is_node_blacklisted(self, pool_id: int, node: str) -> bool:
        return bool(self._call(self.pools, "nodeBlacklisted", pool_id, to_checksum_address(node)))

    def is_provider_blacklisted_in_pool(self, pool_id: int, provider: str) -> bool:
        return bool(self._call(self.pools, "providerBlacklisted", pool_id, to_checksum_address(provider)))

    def invite_used(self, invite: Invite) -> bool:
        return bool(self._call(self.pools, "inviteUsed", invite.digest()))

    def join_pool(self, pool_id: int, node: str, invite: Invite) -> TxResult:
        """Join with the manager's invite; sent by the node key or its provider."""
        if invite.pool_id != pool_id or invite.node != to_checksum_address(node):
            raise LedgerError(
                f"invite is for pool {invite.pool_id} and node {invite.node}, not {pool_id}/{node}"
            )
        return self._tx(
            self.pools,
            "joinComputePool",
            pool_id,
            to_checksum_address(node),
            invite.nonce,
            invite.expiration,
            bytes.fromhex(invite.signature.removeprefix("0x")),
        )

    def leave_pool(self, pool_id: int, node: str) -> TxResult:
        return self._tx(self.pools, "leaveComputePool", pool_id, to_checksum_address(node))

    def eject_node(self, pool_id: int, node: str) -> TxResult:
        return self._tx(self.pools, "ejectNode", pool_id, to_checksum_address(node))

    def blacklist_node(self, pool_id: int, node: str) -> TxResult:
        return self._tx(self.pools, "blacklistNode", pool_id, to_checksum_address(node))

    def blacklist_pool_provider(self, pool_id: int, provider: str) -> TxResult:
        return self._tx(self.pools, "blacklistProvider", pool_id, to_checksum_address(provider))
