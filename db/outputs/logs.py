"""A job's log in SQL (`job_logs`): what it printed, a row per line numbered per job (`seq`), kept
within a bound per job (MXQ_JOB_LOG_BYTES): its first lines (half the bound) and its latest ones,
with one note where the lines between were dropped (`trim`, the rule; the note is the job's one
row of size 0, at the first dropped line's number, saying how many went).

Lines come cleaned (`clean`: no NUL or other control character but a tab, at most `MAX_LINE`
characters), in chunks (`append`: a writer buffers a second or so of lines, never a statement per
line). A writer whose own buffer overflowed between two appends hands a `Gap` where it dropped
lines: they are numbered, never stored, and the note counts them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from mxq.db.engine import rowcount, session_scope
from mxq.db.records import LogLine, LogPage
from mxq.db.reports.history import require_job
from mxq.db.schema import JobLogLine, iso, utcnow
from mxq.status import FINISHED

SOURCES = ("worker", "child", "mxq")  # its worker's log records, its training child's output, mxq's notes
MAX_LINE = 2000  # characters a line keeps; the rest is cut, saying how much
# The least bound (MXQ_JOB_LOG_BYTES): half of it holds the latest line (MAX_LINE, a cut note).
MIN_BYTES = 16 * 2**10
MOST_READ = 10_000  # lines one read returns at most
# Control characters but the tab (C0, DEL, C1), and the Unicode line and paragraph separators.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def clean(text: str) -> str:
    """One line as stored: control characters (a NUL, an escape sequence's ESC, a carriage
    return) removed, a tab kept, at most MAX_LINE characters."""
    text = _CONTROL.sub("", text)
    if len(text) > MAX_LINE:
        cut = len(text) - MAX_LINE
        text = f"{text[:MAX_LINE]} [mxq: {cut} more characters cut]"
    return text


def size_of(text: str) -> int:
    """What a stored line counts against the bound: its UTF-8 bytes and its newline."""
    return len(text.encode()) + 1


@dataclass(frozen=True)
class Line:
    at: datetime
    source: str  # one of SOURCES
    text: str  # cleaned, one line


@dataclass(frozen=True)
class Gap:
    """Lines a writer dropped before they reached SQL (its buffer's bound): numbered, not stored."""

    lines: int


Entry = tuple[int, int | None]  # (seq, size); size None: a gap, whose lines end where the next entry starts


@dataclass(frozen=True)
class Trim:
    """What `trim` drops: the entries from seq `first` to seq `last`, and the note to write at
    `note_seq` saying `dropped` lines went (the lines between it and the first kept after it)."""

    first: int
    last: int
    note_seq: int
    dropped: int


def trim(entries: Sequence[Entry], note_seq: int | None, next_seq: int, limit: int) -> Trim | None:
    """Which of a job's lines to drop so that their sizes fit `limit`: `entries` are its stored
    lines and those being appended (in seq order, `next_seq` the number after the last), the
    note's seq where lines were dropped before (None: never). The head (the lines before the
    note, or while none was dropped the first lines up to half the limit) stays; of the rest the
    oldest go, through the last gap at least. None: nothing to drop."""
    tail = list(entries[_head(entries, note_seq, limit):])
    drop = _dropped(tail, sum(size or 0 for _, size in entries), limit)
    if drop == 0:
        return None
    first = tail[0][0]
    note = first if note_seq is None else note_seq
    after = tail[drop][0] if drop < len(tail) else next_seq
    last = tail[drop - 1][0]
    if tail[drop - 1][1] is None:  # a gap spans its lines up to the next entry
        last = after - 1
    return Trim(first, last, note, after - note)


def _head(entries: Sequence[Entry], note_seq: int | None, limit: int) -> int:
    """How many entries the head keeps: those before the note, or while none was dropped the
    first lines up to half the limit (up to the first gap)."""
    if note_seq is not None:
        return sum(seq < note_seq for seq, _ in entries)
    head, used = 0, 0
    for _, size in entries:
        if size is None or used + size > limit // 2:
            break
        head, used = head + 1, used + size
    return head


def _dropped(tail: Sequence[Entry], total: int, limit: int) -> int:
    """How many of the entries after the head go (`total`: every entry's size): through the
    last gap at least, then the oldest until the rest fit `limit`."""
    drop = max((i + 1 for i, (_, size) in enumerate(tail) if size is None), default=0)
    total -= sum(size or 0 for _, size in tail[:drop])
    while drop < len(tail) and total > limit:
        total -= tail[drop][1] or 0
        drop += 1
    return drop


def dropped_note(dropped: int, limit: int) -> str:
    return (f"[mxq] {dropped} lines dropped here: a job's log keeps its first and its latest lines, "
            f"{limit} bytes in all (MXQ_JOB_LOG_BYTES)")


def started_note(attempt: int, worker: str, devices: Sequence[str]) -> str:
    return f"[mxq] attempt {attempt} started on {', '.join(devices)} (worker {worker})"


def ended_note(attempt: int) -> str:
    """The last line an attempt writes (its worker's final flush): a reader following the log
    knows from it that a finished job's log is complete."""
    return f"[mxq] attempt {attempt} ended"


def append(url: str, job_id: int, items: Sequence[Line | Gap], limit: int) -> None:
    """Add a chunk of lines (and gaps) to job `job_id`'s log, dropping what its bound
    (`limit` bytes) leaves no room for. Two writers of one job at once (an attempt taken for dead,
    still running): the second's chunk fails on the numbers the first took (IntegrityError)."""
    if not items:
        return
    with session_scope(url) as session:
        where = JobLogLine.job_id == job_id
        last, total = session.execute(select(func.max(JobLogLine.seq), func.coalesce(func.sum(
            JobLogLine.size), 0)).where(where)).one()
        new, rows, seq = _numbered(items, (last or 0) + 1)
        cut = _trim_stored(session, job_id, new, seq, limit) if _overflows(new, total, limit) else None
        if cut is not None:
            session.execute(delete(JobLogLine).where(where, JobLogLine.seq.between(cut.first, cut.last),
                                                     JobLogLine.size > 0))
            rows = {n: line for n, line in rows.items() if not cut.first <= n <= cut.last}
        _insert(session, job_id, rows)
        if cut is not None:
            _write_note(session, job_id, cut, limit)


def _overflows(new: Sequence[Entry], total: int, limit: int) -> bool:
    """Whether a chunk makes the log drop lines: it holds a gap, or the sizes pass the bound."""
    return any(size is None for _, size in new) or total + sum(s or 0 for _, s in new) > limit


def _insert(session: Session, job_id: int, rows: dict[int, Line]) -> None:
    if rows:
        session.execute(insert(JobLogLine), [
            {"job_id": job_id, "seq": n, "at": line.at, "source": line.source, "text": line.text,
             "size": size_of(line.text)} for n, line in rows.items()])


def _numbered(items: Sequence[Line | Gap], seq: int) -> tuple[list[Entry], dict[int, Line], int]:
    """The chunk numbered from `seq`: its entries, its lines by number, and the number after it
    (a gap takes its lines' numbers)."""
    new: list[Entry] = []
    rows: dict[int, Line] = {}
    for item in items:
        if isinstance(item, Gap):
            new.append((seq, None))
            seq += item.lines
        else:
            new.append((seq, size_of(item.text)))
            rows[seq] = item
            seq += 1
    return new, rows, seq


def _trim_stored(session: Session, job_id: int, new: list[Entry], next_seq: int, limit: int) -> Trim | None:
    """What to drop of the job's stored lines and the `new` ones so that they fit `limit`."""
    stored = session.execute(select(JobLogLine.seq, JobLogLine.size).where(JobLogLine.job_id == job_id)
                             .order_by(JobLogLine.seq)).all()
    note_seq = next((r.seq for r in stored if r.size == 0), None)
    return trim([(r.seq, r.size) for r in stored if r.size > 0] + new, note_seq, next_seq, limit)


def _write_note(session: Session, job_id: int, cut: Trim, limit: int) -> None:
    """The note where lines were dropped: its count updated, or written at the first dropped
    line's number."""
    text = dropped_note(cut.dropped, limit)
    if not rowcount(session.execute(update(JobLogLine).where(
            JobLogLine.job_id == job_id, JobLogLine.seq == cut.note_seq, JobLogLine.size == 0)
            .values(text=text, at=utcnow()))):
        session.execute(insert(JobLogLine).values(job_id=job_id, seq=cut.note_seq, at=utcnow(),
                                                  source="mxq", text=text, size=0))


def read(url: str, job_id: int, after: int = 0, limit: int = 1000) -> LogPage:
    """Job `job_id`'s log lines numbered above `after`, at most `limit` (NotFound: no such job);
    `next` is the number to read after, `ended` whether the job finished and its last attempt
    wrote its last line (or it never ran): nothing more will come."""
    record = require_job(url, job_id)
    with session_scope(url) as session:
        rows = session.scalars(select(JobLogLine).where(JobLogLine.job_id == job_id,
                                                        JobLogLine.seq > after)
                               .order_by(JobLogLine.seq).limit(min(limit, MOST_READ))).all()
        items: list[LogLine] = [{"seq": r.seq, "at": iso(r.at) or "", "source": r.source,
                                 "text": r.text} for r in rows]
        attempts = record["attempts"]
        closed = attempts == 0 or (session.scalar(
            select(func.count()).select_from(JobLogLine).where(
                JobLogLine.job_id == job_id, JobLogLine.source == "mxq",
                JobLogLine.text == ended_note(attempts))) or 0) > 0
    done = record["status"] in FINISHED and closed and len(items) < limit
    return {"items": items, "next": items[-1]["seq"] if items else after,
            "status": record["status"], "ended": done}
