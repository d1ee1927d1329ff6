"""Slashing by quorum on `ComputePool`: a pool's policy (k of its named validators, the amount, the
window), its validators, their votes and the owner's pardon. A thin wrapper over the client's
transaction sender, one per contract concern (reached as `LedgerClient.slashing`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from eth_utils import to_checksum_address
from pydantic import BaseModel
from web3 import Web3

from ledger.errors import LedgerError
from ledger.models import TxResult

if TYPE_CHECKING:
    from ledger.contracts.base import ContractBase


def work_key_bytes(work_key: bytes | str) -> bytes:
    """Accept 32 raw bytes or 0x-hex; a workKey is sha256 of the submitted file."""
    if isinstance(work_key, str):
        try:
            work_key = bytes.fromhex(work_key.removeprefix("0x"))
        except ValueError:
            raise LedgerError(f"work key {work_key!r} is not hex: want 0x + 64 hex digits") from None
    if len(work_key) != 32:
        raise LedgerError("work key must be 32 bytes (0x followed by 64 hex digits: the file's sha256)")
    return work_key


# A vote's gas cannot be estimated reliably: validators vote at the same time, and the vote that
# reaches the quorum (slash, eject, drop rewards: ~160k gas) costs twice a counted one (~86k). An
# estimate made before another vote lands would run the deciding vote out of gas: votes are sent
# with at least this much (estimated first, so a refused vote still names its error; unused gas
# is not paid).
VOTE_GAS = 400_000


class SlashingPolicy(BaseModel):
    """quorum 0: no policy set (one vote of a global validator, the default penalty and window)."""

    pool_id: int
    quorum: int
    slash_amount: int
    window_seconds: int


class WorkVotes(BaseModel):
    votes: int
    voted: bool  # by the validator asked about


class Slashing:
    def __init__(self, client: ContractBase) -> None:
        self.client = client
        self.pools = client.pools

    def set_policy(self, pool_id: int, quorum: int, slash_amount: int, window_seconds: int) -> TxResult:
        return self.client._tx(self.pools, "setSlashingPolicy", pool_id, quorum, slash_amount, window_seconds)

    def policy(self, pool_id: int) -> SlashingPolicy:
        quorum, window, amount = self.client._call(self.pools, "slashingPolicies", pool_id)
        return SlashingPolicy(pool_id=pool_id, quorum=quorum, slash_amount=amount, window_seconds=window)

    def add_validator(self, pool_id: int, address: str) -> TxResult:
        return self.client._tx(self.pools, "addPoolValidator", pool_id, to_checksum_address(address))

    def remove_validator(self, pool_id: int, address: str) -> TxResult:
        return self.client._tx(self.pools, "removePoolValidator", pool_id, to_checksum_address(address))

    def validators(self, pool_id: int) -> list[str]:
        return [to_checksum_address(a) for a in self.client._call(self.pools, "getPoolValidators", pool_id)]

    def vote_invalidate(self, pool_id: int, work_key: bytes | str) -> TxResult:
        key = work_key_bytes(work_key)
        return self.client._tx(self.pools, "voteInvalidate", pool_id, key, min_gas=VOTE_GAS)

    def vote_soft_invalidate(self, pool_id: int, work_key: bytes | str) -> TxResult:
        key = work_key_bytes(work_key)
        return self.client._tx(self.pools, "voteSoftInvalidate", pool_id, key, min_gas=VOTE_GAS)

    def vote_slash_hardware(self, pool_id: int, node: str, evidence: bytes) -> TxResult:
        """Vote that `node` signed a wrong hardware answer; `evidence` is its 32-byte digest
        (`intellect.hardware_evidence.evidence_digest`), re-checked by the voter first."""
        return self.client._tx(self.pools, "voteSlashHardware", pool_id, to_checksum_address(node),
                               work_key_bytes(evidence), min_gas=VOTE_GAS)  # fmt: skip

    def pardon(self, pool_id: int, work_key: bytes | str) -> TxResult:
        return self.client._tx(self.pools, "pardon", pool_id, work_key_bytes(work_key))

    def votes(self, pool_id: int, work_key: bytes | str, validator: str) -> WorkVotes:
        votes, voted = self.client._call(
            self.pools, "workVotes", pool_id, work_key_bytes(work_key), to_checksum_address(validator)
        )
        return WorkVotes(votes=votes, voted=voted)


def hardware_vote_key(node: str, evidence: bytes) -> bytes:
    """The key a hardware slash vote is tallied under (read it with `votes`): keccak256(node, evidence)."""
    return bytes(Web3.solidity_keccak(["address", "bytes32"], [to_checksum_address(node), evidence]))
