"""Read pool events from a block cursor, oldest first, only from blocks at least `confirmations` deep.

A consumer (the validator) persists `next_block` after handling a batch; reading again from it
never skips or repeats an event as long as no reorg goes deeper than `confirmations` blocks.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from eth_utils import to_checksum_address
from pydantic import BaseModel, ConfigDict, Field

from ledger.artifacts import event_topics
from ledger.client import LedgerClient


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True)

    block_number: int
    log_index: int
    tx_hash: str
    pool_id: int


class WorkSubmittedEvent(_Event):
    """One file on chain. A `WorkBatchSubmitted` log is read as one of these per file, in the batch's
    order (`leaf`), with the batch's index; a single `submitWork` has leaf 0 and no batch."""

    kind: Literal["WorkSubmitted"] = "WorkSubmitted"
    provider: str
    node: str
    work_key: str
    units: int
    timestamp: int
    leaf: int = 0
    batch_index: int | None = None


class WorkInvalidatedEvent(_Event):
    kind: Literal["WorkInvalidated"] = "WorkInvalidated"
    provider: str
    node: str
    work_key: str
    slashed: int
    rewards_dropped: int


class WorkSoftInvalidatedEvent(_Event):
    kind: Literal["WorkSoftInvalidated"] = "WorkSoftInvalidated"
    provider: str
    node: str
    work_key: str
    reward_dropped: int


class NodeJoinedEvent(_Event):
    kind: Literal["NodeJoined"] = "NodeJoined"
    provider: str
    node: str
    nonce: int


class NodeLeftEvent(_Event):
    kind: Literal["NodeLeft"] = "NodeLeft"
    provider: str
    node: str


class NodeEjectedEvent(_Event):
    kind: Literal["NodeEjected"] = "NodeEjected"
    provider: str
    node: str
    by: str


LedgerEvent = Annotated[
    WorkSubmittedEvent
    | WorkInvalidatedEvent
    | WorkSoftInvalidatedEvent
    | NodeJoinedEvent
    | NodeLeftEvent
    | NodeEjectedEvent,
    Field(discriminator="kind"),
]

_FIELDS: dict[str, tuple[type[_Event], dict[str, str]]] = {
    "WorkSubmitted": (WorkSubmittedEvent, {"workKey": "work_key"}),
    "WorkInvalidated": (WorkInvalidatedEvent, {"workKey": "work_key", "rewardsDropped": "rewards_dropped"}),
    "WorkSoftInvalidated": (
        WorkSoftInvalidatedEvent,
        {"workKey": "work_key", "rewardDropped": "reward_dropped"},
    ),
    "NodeJoined": (NodeJoinedEvent, {}),
    "NodeLeft": (NodeLeftEvent, {}),
    "NodeEjected": (NodeEjectedEvent, {}),
}
ALL_KINDS = tuple(_FIELDS)


class EventBatch(BaseModel):
    events: list[LedgerEvent]
    from_block: int
    to_block: int  # last block read (inclusive); from_block - 1 when nothing was safe to read
    next_block: int  # where the next read starts


class EventReader:
    """Typed pool events in (block, log index) order.

    `confirmations=0` reads up to the head; `n` stops `n` blocks below it, so a reorg shallower
    than `n` blocks cannot change what was already returned.
    """

    def __init__(
        self,
        client: LedgerClient,
        confirmations: int = 0,
        *,
        pool_id: int | None = None,
        kinds: tuple[str, ...] = ALL_KINDS,
        start_block: int | None = None,
        max_range: int = 2000,
    ):
        if confirmations < 0:
            raise ValueError("confirmations must be >= 0")
        unknown = set(kinds) - set(_FIELDS)
        if unknown:
            raise ValueError(f"unknown event kinds: {sorted(unknown)}")
        self.client = client
        self.confirmations = confirmations
        self.pool_id = pool_id
        self.kinds = kinds
        self.max_range = max_range
        self.cursor = client.deployment.block if start_block is None else start_block
        wanted = set(kinds) | ({"WorkBatchSubmitted"} if "WorkSubmitted" in kinds else set())
        self._topics = {topic: name for topic, name in event_topics("ComputePool").items() if name in wanted}

    def safe_head(self) -> int:
        return self.client.block_number() - self.confirmations

    def read(self, from_block: int, to_block: int | None = None) -> EventBatch:
        """Events in [from_block, min(to_block, safe head)]."""
        last = self.safe_head() if to_block is None else min(to_block, self.safe_head())
        events: list[_Event] = []
        start = from_block
        while start <= last:
            end = min(start + self.max_range - 1, last)
            events.extend(self._fetch(start, end))
            start = end + 1
        events.sort(key=lambda e: (e.block_number, e.log_index, getattr(e, "leaf", 0)))
        to = max(last, from_block - 1)
        return EventBatch(events=events, from_block=from_block, to_block=to, next_block=to + 1)

    def poll(self) -> list[LedgerEvent]:
        """Read from the internal cursor and advance it."""
        batch = self.read(self.cursor)
        self.cursor = batch.next_block
        return batch.events

    def _fetch(self, start: int, end: int) -> list[_Event]:
        topics: list[Any] = [["0x" + t.hex() for t in self._topics]]
        if self.pool_id is not None:
            topics.append("0x" + self.pool_id.to_bytes(32, "big").hex())
        logs = self.client.w3.eth.get_logs(
            {"address": self.client.pools.address, "fromBlock": start, "toBlock": end, "topics": topics}
        )
        out = []
        for log in logs:
            name = self._topics.get(bytes(log["topics"][0]))
            if name is None:
                continue
            data = getattr(self.client.pools.events, name)().process_log(log)
            if name == "WorkBatchSubmitted":
                out.extend(_batch_files(log, data["args"]))
                continue
            cls, renames = _FIELDS[name]
            fields: dict[str, Any] = {}
            for key, value in data["args"].items():
                if isinstance(value, bytes | bytearray):
                    value = "0x" + bytes(value).hex()
                elif isinstance(value, str) and value.startswith("0x") and len(value) == 42:
                    value = to_checksum_address(value)
                fields[renames.get(key, _snake(key))] = value
            out.append(
                cls(
                    block_number=log["blockNumber"],
                    log_index=log["logIndex"],
                    tx_hash="0x" + bytes(log["transactionHash"]).hex(),
                    **fields,
                )
            )
        return out


def _batch_files(log: Any, args: Any) -> list[_Event]:
    """A batch log as its files, each a `WorkSubmittedEvent` sharing the log's place in the chain."""
    return [
        WorkSubmittedEvent(
            block_number=log["blockNumber"], log_index=log["logIndex"],
            tx_hash="0x" + bytes(log["transactionHash"]).hex(), pool_id=args["poolId"],
            provider=to_checksum_address(args["provider"]), node=to_checksum_address(args["node"]),
            work_key="0x" + bytes(key).hex(), units=int(units), timestamp=args["timestamp"],
            leaf=i, batch_index=args["batchIndex"],
        )  # fmt: skip
        for i, (key, units) in enumerate(zip(args["workKeys"], args["units"], strict=True))
    ]


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
