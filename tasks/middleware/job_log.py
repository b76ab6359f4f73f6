"""A job's log (`mxq logs`): what its run printed, kept with the job in SQL (`db/outputs/logs.py`,
bounded by MXQ_JOB_LOG_BYTES).

While a run lasts its `Recorder` takes its worker's log records (a handler on the root logger:
every record of the process while it runs one job; a process that runs several at once, the
fleet benchmark's simulated workers, gives each only the records of its own thread) and whatever
its body hands it (`recorder(job_id)`: a training child's stdout and stderr). It buffers them
(at most MXQ_JOB_LOG_BYTES: the first lines and the latest, a `Gap` between) and appends them
every FLUSH_SECONDS from a thread of its own, and once more at the run's end, the attempt's
end note last. A write that fails is logged and dropped: a log never fails its job.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from mxq.db.outputs import logs
from mxq.db.outputs.logs import Gap, Line
from mxq.db.schema import utcnow
from mxq.tasks.middleware.middleware import Run

log = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0  # a running job's log reaches SQL this often (when it has new lines)
FORMAT = "%(levelname)s %(name)s: %(message)s"


class Recorder:
    """One run's log on its way to SQL: lines buffered, appended by its flusher thread."""

    def __init__(self, url: str, job_id: int, limit: int) -> None:
        self.url, self.job_id, self.limit = url, job_id, limit
        self._lock = threading.Lock()
        self._first: list[Line] = []  # the buffer's first lines, up to half the bound
        self._first_bytes = 0
        self._gap = 0  # lines dropped between them and the latest
        self._last: deque[Line] = deque()  # the latest lines, up to half the bound
        self._last_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._flushing, name=f"job-log-{job_id}", daemon=True)
        self.thread_id: int | None = None

    def add(self, source: str, text: str) -> None:
        """Lines of `source` (text may hold several), cleaned, into the buffer."""
        lines = [Line(utcnow(), source, logs.clean(t)) for t in text.rstrip("\n").split("\n")]
        with self._lock:
            for line in lines:
                self._keep(line)

    def _keep(self, line: Line) -> None:
        size, half = logs.size_of(line.text), self.limit // 2
        if not self._gap and not self._last and self._first_bytes + size <= half:
            self._first.append(line)
            self._first_bytes += size
            return
        self._last.append(line)
        self._last_bytes += size
        while self._last_bytes > half and len(self._last) > 1:
            self._last_bytes -= logs.size_of(self._last.popleft().text)
            self._gap += 1

    def _take(self) -> list[Line | Gap]:
        with self._lock:
            items: list[Line | Gap] = [*self._first, *([Gap(self._gap)] if self._gap else []),
                                       *self._last]
            self._first, self._last, self._gap = [], deque(), 0
            self._first_bytes = self._last_bytes = 0
        return items

    def flush(self) -> None:
        """Append what the buffer holds; a failure is logged (never into this log) and dropped."""
        items = self._take()
        if not items:
            return
        try:
            logs.append(self.url, self.job_id, items, self.limit)
        except Exception as exc:  # the job goes on without these lines
            log.warning("job %s: %s lines of its log dropped: %s: %s", self.job_id, len(items),
                        type(exc).__name__, exc)

    def start(self) -> None:
        self._thread.start()
        self.thread_id = self._thread.ident

    def close(self) -> None:
        """Stop the flusher and append what is left."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.flush()

    def _flushing(self) -> None:
        while not self._stop.wait(FLUSH_SECONDS):
            self.flush()


# The runs of this process that are recording: job id -> (its recorder, the thread running it).
_running: dict[int, tuple[Recorder, int]] = {}
_guard = threading.Lock()


def recorder(job_id: int) -> Recorder | None:
    """The recorder of job `job_id`'s run in this process (None: not running here)."""
    with _guard:
        found = _running.get(job_id)
    return found[0] if found is not None else None


class _Records(logging.Handler):
    """The process's log records, into the log of the run that emitted them."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            with _guard:
                running = list(_running.values())
            if any(record.thread == r.thread_id for r, _ in running):
                return  # a flusher's own (a failed write): never into a log
            mine = [r for r, t in running if len(running) == 1 or t == record.thread]
            if mine:
                text = self.format(record)
                for r in mine:
                    r.add("worker", text)
        except Exception:
            self.handleError(record)


_handler = _Records(logging.INFO)
_handler.setFormatter(logging.Formatter(FORMAT))


class JobLog:
    def before(self, run: Run) -> None:
        r = Recorder(run.settings.database, run.job_id, run.settings.job_log_bytes)
        r.add("mxq", logs.started_note(run.attempt, run.worker, run.devices))
        r.start()
        with _guard:
            _running[run.job_id] = (r, threading.get_ident())
            root = logging.getLogger()
            if _handler not in root.handlers:
                root.addHandler(_handler)

    def after(self, run: Run) -> None:
        with _guard:
            found = _running.pop(run.job_id, None)
            if not _running:
                logging.getLogger().removeHandler(_handler)
        if found is not None:
            found[0].add("mxq", logs.ended_note(run.attempt))
            found[0].close()
