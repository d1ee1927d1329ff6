"""Alembic environment: the connection comes from orchestrator.db.migrate (no alembic.ini needed)."""

from alembic import context
from sqlalchemy import create_engine

from orchestrator.models import Base

target_metadata = Base.metadata
connection = context.config.attributes.get("connection")

if connection is None:  # `alembic -x url=... revision --autogenerate` from a shell
    url = context.get_x_argument(as_dictionary=True).get("url", "sqlite:///orchestrator.db")
    with create_engine(url).connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
