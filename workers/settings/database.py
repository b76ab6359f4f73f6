"""The database's settings: MXQ_DATABASE_URL, SQLite or PostgreSQL (psycopg 3)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field, field_validator

from mxq.workers.settings.part import Part, check_url

# The URL schemes mxq runs with for the database.
DATABASE_SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg", "postgres")


class DatabaseFields(Part):
    database_url: str | None = Field(None, description="SQLAlchemy URL; unset = SQLite in home.")

    @field_validator("database_url")
    @classmethod
    def _database_scheme(cls, value: str | None) -> str | None:
        return None if value is None else check_url(value, "MXQ_DATABASE_URL", DATABASE_SCHEMES,
                                                    "sqlite:///PATH or postgresql://USER@HOST/DB")


@dataclass(frozen=True)
class DatabaseSettings:
    """The database a process uses (`Settings.database_settings`): its URL, SQLite in the home
    when MXQ_DATABASE_URL is unset."""

    url: str
