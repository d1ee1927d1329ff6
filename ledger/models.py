"""Typed values returned by the ledger client. Amounts are integers in token base units (18 decimals)."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

TOKEN_DECIMALS = 18
ONE_TOKEN = 10**TOKEN_DECIMALS


class PoolStatus(IntEnum):
    PENDING = 0
    ACTIVE = 1
    COMPLETED = 2


class WorkStatus(IntEnum):
    NONE = 0
    SUBMITTED = 1
    INVALIDATED = 2
    SOFT_INVALIDATED = 3


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class TxEvent(_Model):
    """A log decoded with the deployment's ABIs."""

    name: str
    address: str
    log_index: int
    args: dict[str, Any]


class TxResult(_Model):
    tx_hash: str
    block_number: int
    gas_used: int
    status: int
    events: list[TxEvent] = []

    def event(self, name: str) -> TxEvent | None:
        return next((e for e in self.events if e.name == name), None)


class Provider(_Model):
    address: str
    registered: bool
    whitelisted: bool
    blacklisted: bool
    stake: int
    total_compute_units: int
    node_count: int
    registered_at: int


class Node(_Model):
    address: str
    provider: str
    compute_units: int
    validated: bool
    active_pool: int  # 0 = in no pool
    added_at: int


class Unbond(_Model):
    amount: int
    release_at: int


class Domain(_Model):
    id: int
    name: str
    parameters_uri: str
    creator: str
    created_at: int


class Pool(_Model):
    id: int
    domain_id: int
    creator: str
    manager: str
    name: str
    data_uri: str
    compute_limit: int  # 0 = unlimited
    total_compute_units: int
    status: PoolStatus
    created_at: int
    started_at: int
    ended_at: int


class WorkRecord(_Model):
    pool_id: int
    work_key: str  # 0x-prefixed hex of the 32-byte key (sha256 of the file)
    provider: str
    node: str
    units: int
    reward: int
    timestamp: int
    status: WorkStatus


class BatchRecord(_Model):
    """One `submitWorkBatch`: its files are `WorkRecord`s by key; this is what they share."""

    pool_id: int
    index: int
    root: str  # 0x hex of the standard Merkle root over (work key, units)
    provider: str
    node: str
    timestamp: int
    count: int
    live_units: int  # units still carrying reward (a soft invalidation takes a file's units out)
    lock_index: int


class WorkParameters(_Model):
    reward_per_unit: int
    reward_lock_period: int
    invalidation_window: int
    slash_penalty: int
    whitelist_required: bool
