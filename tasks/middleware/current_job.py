"""The worker's heartbeat names the job it runs: the reconciler tells a live job from a lost one
by it, and the heartbeat stops a worker stuck in a job taken from it."""

from __future__ import annotations

from mxq.tasks.middleware.middleware import Run


class CurrentJob:
    def before(self, run: Run) -> None:
        if run.heartbeat is not None:
            run.heartbeat.current_job = run.job_id

    def after(self, run: Run) -> None:
        if run.heartbeat is not None:
            run.heartbeat.current_job = None
