"""round_trips: each node's measured TCP handshake round trip to another node's peer inbox

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "round_trips",
        sa.Column("reporter", sa.String(42), primary_key=True),
        sa.Column("target", sa.String(42), primary_key=True),
        sa.Column("ms", sa.Float(), nullable=True),
        sa.Column("at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("round_trips")
