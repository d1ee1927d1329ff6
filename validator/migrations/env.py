"""Alembic environment of the validator's database: the connection comes from `validator.store.migrate`
(no alembic.ini needed). Its own version table: a validator may share a PostgreSQL database with the
orchestrator (no table names collide), whose history is another."""

from alembic import context
from sqlalchemy import create_engine

from validator.store import VERSION_TABLE, Base

target_metadata = Base.metadata
connection = context.config.attributes.get("connection")

if connection is None:  # `alembic -x url=... revision --autogenerate` from a shell
    url = context.get_x_argument(as_dictionary=True).get("url", "sqlite:///validator.db")
    with create_engine(url).connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True,
                          version_table=VERSION_TABLE)
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True,
                      version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()
