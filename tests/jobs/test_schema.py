"""The models and the migrations describe the same schema, on both backends; `mxq migrate` says
what it applied; a registry clash is a conflict."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from mxq.db import registry, schedules
from mxq.db.engine import get_engine
from mxq.db.migrate import MIGRATIONS, upgrade
from mxq.db.schema import Base, utcnow
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


def test_a_database_a_newer_mxq_migrated_is_refused_in_one_line(tmp_path: Path) -> None:
    """A revision this mxq does not ship: one line naming it and the newest known, exit 2."""
    env = {"MXQ_HOME": str(tmp_path / "var")}
    assert run_cli(["migrate"], env).returncode == 0
    url = f"sqlite:///{tmp_path / 'var' / 'mxq.db'}"
    with get_engine(url).begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0099_future'"))
    refused = run_cli(["migrate"], env)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "'0099_future', which this mxq does not know" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_a_version_taken_by_a_concurrent_add_is_a_conflict(isolated: Stack) -> None:
    url = isolated.settings.database
    record = {"name": "raced", "version": 1, "arch": "mlp", "input_shape": [4], "classes": 2,
              "params_file": "p", "symbol_file": "s", "checksum": "0" * 64, "source": "test"}
    registry.add_model(url, record)
    with pytest.raises(Conflict, match="model raced version 1 was added concurrently; add it again"):
        registry.add_model(url, record)  # what the loser of two `models add` at once does
    assert [m["version"] for m in registry.list_models(url, "raced")] == [1]


def test_0009_keeps_fires_and_fills_in_their_schedule(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url, "0008")
    with get_engine(url).begin() as conn:
        conn.execute(text("INSERT INTO schedules (id, name, cron, tz, spec, dataset, promote, metric, "
                          "min_gain, enabled, next_fire_at, created_at) VALUES (1, 'nightly', "
                          "'0 3 * * *', 'UTC', '{}', 'd.npz', 'never', 'val_accuracy', 0.5, 1, "
                          "'2026-01-01 03:00:00', '2026-01-01 00:00:00')"))
        conn.execute(text("INSERT INTO schedule_fires (id, schedule_id, fire_time, fired_at, manual, "
                          "missed) VALUES (7, 1, '2026-01-01 03:00:00', '2026-01-01 03:00:01', 0, 0)"))
    assert upgrade(url, "0009") == ["0009"]
    upgrade(url)  # the code reads today's schema: 0009's fill-in survives what came after
    assert schedules.fire_of(url, 7) == {"schedule": "nightly", "fire_time": "2026-01-01T03:00:00+00:00",
                                         "promote": "never", "metric": "val_accuracy", "min_gain": 0.5,
                                         "min_metric": None, "removed": False}
    schedules.remove(url, "nightly")
    assert schedules.fire_of(url, 7)["removed"] is True


def test_ids_are_never_reused_after_a_delete(isolated: Stack) -> None:
    """SQLite without AUTOINCREMENT hands a deleted last row's id to the next insert."""
    url = isolated.settings.database
    def add(name: str) -> None:
        schedules.add(url, {"name": name, "cron": "0 3 * * *", "tz": "UTC", "dataset": "d.npz",
                            "spec": {"arch": "mlp", "name": "m"}, "promote": "never",
                            "metric": "val_accuracy", "min_gain": 0.0, "enabled": True,
                            "next_fire_at": utcnow()})

    add("first")
    add("second")
    removed = schedules.get(url, "second")["id"]
    schedules.remove(url, "second")
    add("third")
    assert schedules.get(url, "third")["id"] > removed
    insert = text("INSERT INTO jobs (kind, status, params, requested_device, queue, submitted_at, "
                  "progress, attempts) VALUES ('probe', 'failed', '{}', 'auto', 'q', "
                  "'2026-01-01 00:00:00', 0, 0)")
    with get_engine(url).begin() as conn:
        conn.execute(insert)
        deleted = conn.execute(text("SELECT max(id) FROM jobs")).scalar_one()
        conn.execute(text("DELETE FROM jobs WHERE id = :id"), {"id": deleted})
        conn.execute(insert)
        assert conn.execute(text("SELECT max(id) FROM jobs")).scalar() == deleted + 1


def _old_database(tmp_path: Path, revision: str, kind: str, *rows: str) -> str:
    """A SQLite database at `revision` holding job 7 (of `kind`) and `rows` (INSERTs)."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url, revision)
    with get_engine(url).begin() as conn:
        conn.execute(text("INSERT INTO jobs (id, kind, status, params, requested_device, queue, "
                          f"submitted_at, progress, attempts) VALUES (7, '{kind}', 'succeeded', '{{}}', "
                          "'auto', 'q', '2026-01-01 00:00:00', 1, 1)"))
        for row in rows:
            conn.execute(text(row))
    return url


def test_0010_keeps_rows_and_their_references(tmp_path: Path) -> None:
    url = _old_database(tmp_path, "0009", "probe", "INSERT INTO job_events (id, job_id, at, kind, "
                        "message, data) VALUES (3, 7, '2026-01-01 00:00:00', 'requeued', 'm', '{}')")
    assert upgrade(url, "0010") == ["0010"]
    with get_engine(url).begin() as conn:
        assert conn.execute(text("SELECT job_id FROM job_events WHERE id = 3")).scalar() == 7
        sql = conn.execute(text("SELECT sql FROM sqlite_master WHERE name = 'jobs'")).scalar_one()
        assert "AUTOINCREMENT" in sql
        assert conn.execute(text("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'")).scalar() == 7


def test_0037_keeps_predictions_and_drops_their_job_check(tmp_path: Path) -> None:
    """The rebuilt table holds the rows it held; a row no job's transaction fenced is now the
    writers' to prevent, not a trigger's (migration 0037)."""
    url = _old_database(tmp_path, "0036", "infer", "INSERT INTO predictions (job_id, idx, "
                        "predicted_class, score) VALUES (7, 0, 3, 0.5), (7, 1, 4, 0.25)")
    assert upgrade(url, "0037") == ["0037"]
    with get_engine(url).begin() as conn:
        rows = conn.execute(text("SELECT job_id, idx, predicted_class, score FROM predictions "
                                 "ORDER BY idx")).all()
        assert [tuple(r) for r in rows] == [(7, 0, 3, 0.5), (7, 1, 4, 0.25)]
        assert conn.execute(text("PRAGMA foreign_key_list(predictions)")).all() == []
        sql = conn.execute(text("SELECT sql FROM sqlite_master WHERE name = 'predictions'")).scalar_one()
        assert "PRIMARY KEY (job_id, idx)" in sql and sql.rstrip().endswith("WITHOUT ROWID")


def test_0038_keeps_predictions_as_blocks_of_consecutive_samples(tmp_path: Path) -> None:
    """Each job's rows become blocks cut where an index skips (and every 4,096 samples): read
    back the same, top-k included; downgrading gives the rows back."""
    from alembic import command
    from alembic.config import Config

    from mxq.db.outputs import predictions

    values = [f"(7, {i}, {i % 10}, {i / 8}, {'NULL' if i % 3 else repr(f'[[{i % 10}, 0.5]]')})"
              for i in [*range(4100), *range(4200, 4210)]] + ["(8, 0, 1, 0.25, NULL)"]
    url = _old_database(tmp_path, "0037", "infer", "INSERT INTO predictions (job_id, idx, "
                        f"predicted_class, score, top_k) VALUES {', '.join(values)}")
    assert upgrade(url, "0038") == ["0038"]
    with get_engine(url).begin() as conn:
        assert conn.execute(text("SELECT job_id, first_index, samples FROM predictions ORDER BY "
                                 "job_id, first_index")).all() == \
            [(7, 0, 4096), (7, 4096, 4), (7, 4200, 10), (8, 0, 1)]
    stored = predictions.read(url, 7)
    assert [(r["index"], r["predicted_class"], r["score"]) for r in stored] == \
        [(i, i % 10, i / 8) for i in [*range(4100), *range(4200, 4210)]]
    ranks: list[object] = [r["top_k"] for r in stored[:4]]
    assert ranks == [[[0, 0.5]], None, None, [[3, 0.5]]]
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with get_engine(url).begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0037")
        back = conn.execute(text("SELECT idx, predicted_class, score FROM predictions WHERE job_id = 7 "
                                 "ORDER BY idx")).all()
    assert [tuple(r) for r in back] == [(i, i % 10, i / 8) for i in [*range(4100), *range(4200, 4210)]]
