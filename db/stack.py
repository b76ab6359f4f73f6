"""This database's stack id (table `stack`, made by migration 0015).

What a stack keeps under its home folder is keyed by this id (`outputs/<id>/`, `models/<id>/`,
`checkpoints/<id>/`), so a home reused with a new database never serves the old one's files: a
new database has a new id, and its jobs and models start in empty folders.
"""

from __future__ import annotations

import functools

from sqlalchemy import select

from mxq.db.engine import session_scope
from mxq.db.schema import StackRow


@functools.lru_cache(maxsize=16)
def stack_id(url: str) -> str:
    """The id of the stack whose database is `url` (read once per process: it never changes)."""
    with session_scope(url) as session:
        found = session.scalar(select(StackRow.id).order_by(StackRow.created_at).limit(1))
    if found is None:
        raise RuntimeError(f"the database {url.split('@')[-1]} has no stack id: run `mxq migrate`")
    return found
