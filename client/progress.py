"""The progress bar of one job, drawn while someone waits for it: `Job.wait(progress=True)` and
the CLI's `--wait` (`mxq.cli.render.wait_for`) draw this one.

It imports Rich only (no httpx): the CLI imports it at its start, which must stay fast
(tests/house/test_cli_start.py), and `mxq.client` loads its `Client` lazily for that reason."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


class JobBar:
    """A transient bar on stderr (or `console`): the job, its status, how far it is and the time
    spent waiting. Gone once closed, so what is printed next starts on a clean line."""

    def __init__(self, job_id: int, console: Console | None = None) -> None:
        self._progress = Progress(TextColumn(f"job {job_id} {{task.fields[status]:<9}}"), BarColumn(),
                                  TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
                                  console=console or Console(stderr=True), transient=True)
        self._task = self._progress.add_task("job", total=1.0, status="queued")

    def __enter__(self) -> JobBar:
        self._progress.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._progress.stop()

    def show(self, status: str, progress: float | None) -> None:
        """The job's status and progress (0 to 1; None before it has any)."""
        self._progress.update(self._task, completed=progress or 0.0, status=status)
