"""SQL tables: what must survive a restart (nodes, tasks, assignments, audit log)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    """Naive UTC (SQLite keeps no time zone; every timestamp in these tables is UTC)."""
    return datetime.now(UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class NodeRow(Base):
    __tablename__ = "nodes"

    address: Mapped[str] = mapped_column(String(42), primary_key=True)
    provider: Mapped[str | None] = mapped_column(String(42))
    ip_address: Mapped[str | None] = mapped_column(String(255))
    port: Mapped[int | None] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(32), index=True)
    misses: Mapped[int] = mapped_column(Integer, default=0)
    in_pool: Mapped[bool] = mapped_column(Boolean, default=False)
    invite_attempts: Mapped[int] = mapped_column(Integer, default=0)
    invited_at: Mapped[datetime | None] = mapped_column(DateTime)
    next_invite_at: Mapped[datetime | None] = mapped_column(DateTime)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime)
    state_changed_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    discovery_updated_at: Mapped[datetime | None] = mapped_column(DateTime)
    reason: Mapped[str | None] = mapped_column(Text)
    joined_via: Mapped[str | None] = mapped_column(String(16))  # push: API called; pull: from discovery
    node_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)

    @property
    def worker_url(self) -> str | None:
        return f"http://{self.ip_address}:{self.port}" if self.ip_address and self.port else None


class TaskRow(Base):
    __tablename__ = "tasks"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    config_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, index=True)
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime)


class AssignmentRow(Base):
    """A node's reported progress on a task; written when the reported state changes, not per heartbeat."""

    __tablename__ = "assignments"
    __table_args__ = (UniqueConstraint("task_id", "node_address"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id"), index=True)
    node_address: Mapped[str] = mapped_column(String(42), index=True)
    state: Mapped[str] = mapped_column(String(32))
    detail: Mapped[str | None] = mapped_column(Text)
    assigned_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class AuditRow(Base):
    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str | None] = mapped_column(String(128))
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class UploadRow(Base):
    """One granted upload: which node may PUT which file (by sha256) under which storage key."""

    __tablename__ = "uploads"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    node_address: Mapped[str] = mapped_column(String(42), index=True)
    task_id: Mapped[str] = mapped_column(String(36), index=True)
    key: Mapped[str] = mapped_column(String(1024), unique=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)  # one work key on chain per content
    size: Mapped[int] = mapped_column(Integer)
    work_units: Mapped[int] = mapped_column(Integer)
    file_index: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), index=True)  # granted | completed
    expires_at: Mapped[datetime] = mapped_column(DateTime)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    completed_at: Mapped[datetime | None] = mapped_column(DateTime)


class FileCounterRow(Base):
    """`${CURRENT_FILE_INDEX}`: files granted so far per (node, task); survives restarts."""

    __tablename__ = "file_counters"

    node_address: Mapped[str] = mapped_column(String(42), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    count: Mapped[int] = mapped_column(Integer, default=0)


class NodeGroupRow(Base):
    __tablename__ = "node_groups"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    topology: Mapped[str] = mapped_column(String(64))
    task_id: Mapped[str | None] = mapped_column(String(36), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class GroupMemberRow(Base):
    """A node belongs to at most one group (primary key on the address)."""

    __tablename__ = "group_members"

    node_address: Mapped[str] = mapped_column(String(42), primary_key=True)
    group_id: Mapped[str] = mapped_column(ForeignKey("node_groups.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    p2p_address: Mapped[str | None] = mapped_column(String(255))


class HardwareProofRow(Base):
    """One hardware challenge a node answered (docs/hardware.md): what it proved, or why not, with the
    signed evidence of a wrong answer (the challenge, its commitment, the secret and the answer)."""

    __tablename__ = "hardware_proofs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node_address: Mapped[str] = mapped_column(String(42), index=True)
    at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, index=True)
    n: Mapped[int] = mapped_column(Integer)
    precision: Mapped[str] = mapped_column(String(16))
    outcome: Mapped[str] = mapped_column(String(16))  # proven | wrong | unopened | unanswered
    flops: Mapped[float | None] = mapped_column(Float)  # proven lower bound (proven only)
    rtt_ms: Mapped[float | None] = mapped_column(Float)  # measured round trip to the node's API
    seconds: Mapped[float | None] = mapped_column(Float)  # challenge sent → commitment received
    reasons: Mapped[list[str] | None] = mapped_column(JSON)
    evidence: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # wrong and unopened only


class RoundTripRow(Base):
    """What `reporter` measured to `target`'s peer inbox (the shortest of a few TCP handshakes, ms; None:
    it could not be reached), latest only. A link counts for placement only when both of its ends
    measured it, and at the larger of their figures (orchestrator/store/round_trips.py)."""

    __tablename__ = "round_trips"

    reporter: Mapped[str] = mapped_column(String(42), primary_key=True)
    target: Mapped[str] = mapped_column(String(42), primary_key=True)
    ms: Mapped[float | None] = mapped_column(Float)
    at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
