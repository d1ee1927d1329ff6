"""cursor, blocks, submissions, verdicts, seen files and rows, node windows: the schema the
hand-migrated store left

Before this revision the store made its tables with `create_all` at every start and then added the
columns of later releases by hand (ALTER TABLE when missing), so a database from any earlier release
holds part of this schema: a table made by a later release may be absent, a column added later may
be missing, `node_windows.node` may still be 42 characters (PostgreSQL enforces it; SQLite does not).
This revision makes what is missing and leaves what is there, so every such database and a fresh one
come out the same. Later revisions are plain steps.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TABLES = ["cursor", "blocks", "submissions", "verdicts", "seen_files", "seen_rows", "node_windows"]

# Added to existing tables by releases before this revision, as the store added them then.
ADDED_COLUMNS: list[tuple[str, sa.Column[int] | sa.Column[str]]] = [
    ("submissions", sa.Column("log_index", sa.Integer(), nullable=False, server_default="0")),
    ("submissions", sa.Column("leaf", sa.Integer(), nullable=False, server_default="0")),
    ("submissions", sa.Column("trainer_step_before", sa.Integer(), nullable=True)),
    ("verdicts", sa.Column("judged_by", sa.Text(), nullable=True)),
]
NODE_KEY_LENGTH = 256  # "<address>#<task id>" (the counter window's key) is longer than an address


def upgrade() -> None:
    have = sa.inspect(op.get_bind())
    existing = set(have.get_table_names())
    for name in TABLES:
        if name not in existing:
            _CREATE[name]()
    for table, column in ADDED_COLUMNS:
        if table in existing and column.name not in {c["name"] for c in have.get_columns(table)}:
            with op.batch_alter_table(table) as batch:
                batch.add_column(column)
    if "node_windows" in existing and op.get_bind().dialect.name != "sqlite":
        node = next(c for c in have.get_columns("node_windows") if c["name"] == "node")
        if (getattr(node["type"], "length", None) or NODE_KEY_LENGTH) < NODE_KEY_LENGTH:
            op.alter_column("node_windows", "node", type_=sa.String(NODE_KEY_LENGTH), existing_nullable=False)


def downgrade() -> None:
    for name in reversed(TABLES):
        op.drop_table(name)


def _cursor() -> None:
    op.create_table(
        "cursor",
        sa.Column("pool_id", sa.Integer(), primary_key=True),
        sa.Column("next_block", sa.BigInteger(), nullable=False),
    )


def _blocks() -> None:
    op.create_table(
        "blocks",
        sa.Column("pool_id", sa.Integer(), primary_key=True),
        sa.Column("number", sa.BigInteger(), primary_key=True),
        sa.Column("hash", sa.String(66), nullable=False),
    )


def _submissions() -> None:
    op.create_table(
        "submissions",
        sa.Column("pool_id", sa.Integer(), primary_key=True),
        sa.Column("work_key", sa.String(66), primary_key=True),
        sa.Column("node", sa.String(42), nullable=False, index=True),
        sa.Column("provider", sa.String(42), nullable=False),
        sa.Column("units", sa.BigInteger(), nullable=False),
        sa.Column("block_number", sa.BigInteger(), nullable=False, index=True),
        sa.Column("log_index", sa.Integer(), nullable=False),
        sa.Column("leaf", sa.Integer(), nullable=False),
        sa.Column("tx_hash", sa.String(66), nullable=False),
        sa.Column("submitted_at", sa.BigInteger(), nullable=False),
        sa.Column("trainer_step", sa.Integer(), nullable=True),
        sa.Column("trainer_step_before", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.Float(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
    )


def _verdicts() -> None:
    op.create_table(
        "verdicts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("pool_id", sa.Integer(), nullable=False, index=True),
        sa.Column("work_key", sa.String(66), nullable=False, index=True),
        sa.Column("node", sa.String(42), nullable=False, index=True),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False, index=True),
        sa.Column("reasons", sa.Text(), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("timings", sa.Text(), nullable=False),
        sa.Column("judged_by", sa.Text(), nullable=True),
        sa.Column("block_number", sa.BigInteger(), nullable=False),
        sa.Column("file_path", sa.Text(), nullable=True),
        sa.Column("vote_tx", sa.String(66), nullable=True),
        sa.Column("vote_state", sa.String(16), nullable=False),
        sa.Column("vote_error", sa.Text(), nullable=True),
        sa.Column("decided_at", sa.Float(), nullable=False),
    )


def _seen_files() -> None:
    op.create_table(
        "seen_files",
        sa.Column("pool_id", sa.Integer(), primary_key=True),
        sa.Column("sha256", sa.String(64), primary_key=True),
    )


def _seen_rows() -> None:
    op.create_table(
        "seen_rows",
        sa.Column("pool_id", sa.Integer(), primary_key=True),
        sa.Column("digest", sa.String(128), primary_key=True),
    )


def _node_windows() -> None:
    op.create_table(
        "node_windows",
        sa.Column("pool_id", sa.Integer(), primary_key=True),
        sa.Column("node", sa.String(NODE_KEY_LENGTH), primary_key=True),
        sa.Column("entries", sa.Text(), nullable=False),
    )


_CREATE = {"cursor": _cursor, "blocks": _blocks, "submissions": _submissions, "verdicts": _verdicts,
           "seen_files": _seen_files, "seen_rows": _seen_rows, "node_windows": _node_windows}
