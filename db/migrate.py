"""Bring a database to the newest schema with the Alembic migrations shipped in `db/migrations`."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

from mxq.db.engine import answers_within, get_engine, safe_url
from mxq.errors import Conflict

MIGRATIONS = Path(__file__).parent / "migrations"


class NewerSchema(Conflict):
    """The database is at a revision this mxq does not ship: a newer mxq made it."""


def _check_known(url: str, script: ScriptDirectory, current: str | None) -> None:
    """Refuse, in one line, a database a newer mxq migrated (Alembic itself raises a traceback
    about a revision it cannot locate)."""
    if current is not None and current not in {r.revision for r in script.walk_revisions()}:
        raise NewerSchema(f"the database at {safe_url(url)} is at schema revision {current!r}, which "
                          f"this mxq does not know (its newest is {script.get_current_head()!r}): "
                          "a newer mxq migrated it; run that version, or upgrade mxq")


def upgrade(url: str, revision: str = "head") -> list[str]:
    """Run the migrations up to `revision` (idempotent); the revisions it applied, oldest first.

    The connection that ran them is closed afterwards: on PostgreSQL, bulk COPY of predictions
    through it ran at 0.75 of a fresh connection's rate (measured with bench/writes.py)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    engine = get_engine(url)
    with answers_within(None), engine.connect() as conn:  # a large table's rebuild takes minutes
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:  # a rebuilt table must not delete or refuse what refers to it (0010)
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")  # only outside a transaction
            conn.commit()
        with conn.begin():
            before = MigrationContext.configure(conn).get_current_revision()
            _check_known(url, ScriptDirectory.from_config(cfg), before)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            after = MigrationContext.configure(conn).get_current_revision()
            if sqlite:
                _check_foreign_keys(conn)
        if sqlite:
            conn.exec_driver_sql("PRAGMA foreign_keys=ON")
            conn.commit()
    engine.dispose()
    if after == before or after is None:
        return []
    script = ScriptDirectory.from_config(cfg)
    return [r.revision for r in reversed(list(script.iterate_revisions(after, before)))]


def _check_foreign_keys(conn: Connection) -> None:
    """Refuse to commit migrations that left a row referring to nothing (SQLite, keys off)."""
    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
    if broken:
        raise RuntimeError(f"migration left {len(broken)} rows with a broken reference, first: "
                           f"{tuple(broken[0])}; nothing was applied")


def current_revision(url: str) -> str | None:
    with get_engine(url).connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
