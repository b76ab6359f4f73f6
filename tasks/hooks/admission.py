"""A run's end frees its devices: the next job its owner's quota or fair share holds may go now,
not at the reconciler's next pass (`workers/jobs/admit.admit_quietly`, which never fails the
run: a failure is logged and the reconciler admits)."""

from __future__ import annotations

from mxq.tasks.hooks.hook import Run
from mxq.workers.jobs import admit


class AdmitNext:
    def before(self, run: Run) -> None:
        pass

    def after(self, run: Run) -> None:
        admit.admit_quietly(run.settings)
