"""uploads, file counters, node groups and their members

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "uploads",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("node_address", sa.String(42), nullable=False, index=True),
        sa.Column("task_id", sa.String(36), nullable=False, index=True),
        sa.Column("key", sa.String(1024), nullable=False, unique=True),
        sa.Column("sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("work_units", sa.Integer, nullable=False),
        sa.Column("file_index", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("expires_at", sa.DateTime, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("completed_at", sa.DateTime),
    )
    op.create_table(
        "file_counters",
        sa.Column("node_address", sa.String(42), primary_key=True),
        sa.Column("task_id", sa.String(36), primary_key=True),
        sa.Column("count", sa.Integer, nullable=False),
    )
    op.create_table(
        "node_groups",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("topology", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(36), index=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "group_members",
        sa.Column("node_address", sa.String(42), primary_key=True),
        sa.Column("group_id", sa.String(36), sa.ForeignKey("node_groups.id", ondelete="CASCADE"),
                  nullable=False, index=True),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("p2p_address", sa.String(255)),
    )


def downgrade() -> None:
    for table in ("group_members", "node_groups", "file_counters", "uploads"):
        op.drop_table(table)
