"""A run's end frees its devices and decides the jobs that wait for it (`--after`): those go
now, or fail, and the next job its owner's quota or fair share holds may go now, not at the
reconciler's next pass (`workers/jobs/dependencies.settle_quietly`, then
`workers/jobs/admit.admit_quietly`, which never fail the run: a failure is logged and the
reconciler settles and admits)."""

from __future__ import annotations

from mxq.tasks.middleware.middleware import Run
from mxq.workers.jobs import admit, dependencies


class AdmitNext:
    def before(self, run: Run) -> None:
        pass

    def after(self, run: Run) -> None:
        dependencies.settle_quietly(run.settings)  # first: a wait it ends may join the admitter's
        admit.admit_quietly(run.settings)
