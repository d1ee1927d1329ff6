"""hardware_proofs: each hardware challenge a node answered, its proven figures or the evidence against it

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hardware_proofs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("node_address", sa.String(42), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("precision", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("flops", sa.Float(), nullable=True),
        sa.Column("rtt_ms", sa.Float(), nullable=True),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.Column("reasons", sa.JSON(), nullable=True),
        sa.Column("evidence", sa.JSON(), nullable=True),
    )
    op.create_index("ix_hardware_proofs_node_address", "hardware_proofs", ["node_address"])
    op.create_index("ix_hardware_proofs_at", "hardware_proofs", ["at"])


def downgrade() -> None:
    op.drop_index("ix_hardware_proofs_at", "hardware_proofs")
    op.drop_index("ix_hardware_proofs_node_address", "hardware_proofs")
    op.drop_table("hardware_proofs")
