"""nodes.joined_via: how a node's invite reached it (push: its API called; pull: fetched at discovery)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("joined_via", sa.String(16), nullable=True))


def downgrade() -> None:
    op.drop_column("nodes", "joined_via")
