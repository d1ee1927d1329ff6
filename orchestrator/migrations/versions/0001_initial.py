"""nodes, tasks, assignments, audit log

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("address", sa.String(42), primary_key=True),
        sa.Column("provider", sa.String(42)),
        sa.Column("ip_address", sa.String(255)),
        sa.Column("port", sa.Integer),
        sa.Column("state", sa.String(32), nullable=False, index=True),
        sa.Column("misses", sa.Integer, nullable=False),
        sa.Column("in_pool", sa.Boolean, nullable=False),
        sa.Column("invite_attempts", sa.Integer, nullable=False),
        sa.Column("invited_at", sa.DateTime),
        sa.Column("next_invite_at", sa.DateTime),
        sa.Column("last_heartbeat_at", sa.DateTime),
        sa.Column("state_changed_at", sa.DateTime, nullable=False),
        sa.Column("discovery_updated_at", sa.DateTime),
        sa.Column("reason", sa.Text),
        sa.Column("metadata", sa.JSON),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "tasks",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False, index=True),
        sa.Column("deleted_at", sa.DateTime),
    )
    op.create_table(
        "assignments",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.String(36), sa.ForeignKey("tasks.id"), nullable=False, index=True),
        sa.Column("node_address", sa.String(42), nullable=False, index=True),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("detail", sa.Text),
        sa.Column("assigned_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
        sa.UniqueConstraint("task_id", "node_address"),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime, nullable=False, index=True),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(128)),
        sa.Column("detail", sa.JSON),
    )


def downgrade() -> None:
    for table in ("audit_log", "assignments", "tasks", "nodes"):
        op.drop_table(table)
