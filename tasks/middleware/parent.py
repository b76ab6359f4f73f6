"""A chunk's (or a node's part's) end may be its parent's: the parent is settled after each one,
succeeded with the samples of all once every chunk did, failed with the first one's error
(`db/chunks.settle_parent`); the reconciler settles one whose last chunk's worker died first."""

from __future__ import annotations

from mxq.db.chunks import settle_parent
from mxq.tasks.middleware.middleware import Run


class SettleParent:
    def before(self, run: Run) -> None:
        pass

    def after(self, run: Run) -> None:
        if run.parent_id is not None:
            settle_parent(run.settings.database, run.parent_id)
