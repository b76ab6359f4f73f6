"""Alembic environment: runs migrations on the connection `db.migrate` hands over."""

from alembic import context

from mxq.db.schema import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
