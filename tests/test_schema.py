"""The models and the migrations describe the same schema, on both backends; `mxq migrate` says
what it applied; a registry clash is a conflict."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from mxq.db import registry
from mxq.db.engine import get_engine
from mxq.db.migrate import MIGRATIONS, upgrade
from mxq.db.schema import Base
from mxq.errors import Conflict
from tests.conftest import Stack, run_cli

pytestmark = pytest.mark.both_legs  # SQLite and PostgreSQL reflect types and indexes differently


def test_migrations_and_models_do_not_drift(isolated: Stack) -> None:
    url = isolated.settings.database
    assert upgrade(url) == []  # the stack's database is migrated already
    with get_engine(url).connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}),
                                Base.metadata)
    assert diff == [], diff


def test_migrate_on_an_empty_database_says_what_it_applied(tmp_path: Path) -> None:
    env = {"MXQ_HOME": str(tmp_path / "var")}
    first = run_cli(["migrate"], env)
    assert first.returncode == 0, first.stderr
    shipped = sorted(p.name[:4] for p in (MIGRATIONS / "versions").glob("0*.py"))
    assert f"applied {len(shipped)} migration(s), {', '.join(shipped)}; now at {shipped[-1]}" \
        in first.stdout
    again = run_cli(["migrate"], env)
    assert f"is at the newest schema ({shipped[-1]}): nothing to apply" in again.stdout


def test_a_version_taken_by_a_concurrent_add_is_a_conflict(isolated: Stack) -> None:
    url = isolated.settings.database
    record = {"name": "raced", "version": 1, "arch": "mlp", "input_shape": [4], "classes": 2,
              "params_file": "p", "symbol_file": "s", "checksum": "0" * 64, "source": "test"}
    registry.add_model(url, record)
    with pytest.raises(Conflict, match="model raced version 1 was added concurrently; add it again"):
        registry.add_model(url, record)  # what the loser of two `models add` at once does
    assert [m["version"] for m in registry.list_models(url, "raced")] == [1]
