"""A job's log in SQL (`db/outputs/logs.py`): lines numbered per job, cleaned, read after a
number, and bounded: the first and latest lines kept, one note counting those dropped between."""

from __future__ import annotations

import pytest

from mxq.db import jobs
from mxq.db.outputs import logs
from mxq.db.outputs.logs import Gap, Line
from mxq.db.schema import utcnow
from tests.conftest import Stack

pytestmark = pytest.mark.both_legs  # SQL: SQLite and PostgreSQL

LIMIT = logs.MIN_BYTES


def _new(stack: Stack) -> int:
    return jobs.create_job(stack.settings.database, "probe", {}, "auto", "pool.cpu")


def _lines(texts: list[str], source: str = "child") -> list[Line | Gap]:
    return [Line(utcnow(), source, t) for t in texts]


def test_lines_are_numbered_and_read_after_a_number(stack: Stack) -> None:
    url, job = stack.settings.database, _new(stack)
    logs.append(url, job, _lines(["one", "two"]), LIMIT)
    logs.append(url, job, _lines(["three"], "worker"), LIMIT)
    page = logs.read(url, job)
    assert [(x["seq"], x["source"], x["text"]) for x in page["items"]] == [
        (1, "child", "one"), (2, "child", "two"), (3, "worker", "three")]
    assert page["next"] == 3 and not page["ended"]  # queued: more may come
    later = logs.read(url, job, after=2)
    assert [x["text"] for x in later["items"]] == ["three"]
    assert logs.read(url, job, after=3) == {"items": [], "next": 3, "status": "queued", "ended": False}


def test_a_line_is_cleaned_of_control_characters_and_cut() -> None:
    assert logs.clean("a\x00b\x1b[31mred\x1b[0m\r\tend\x7f\u2028") == "ab[31mred[0m\tend"
    long = logs.clean("x" * (logs.MAX_LINE + 10))
    assert long.startswith("x" * logs.MAX_LINE) and long.endswith("[mxq: 10 more characters cut]")


def test_the_bound_keeps_the_first_and_latest_lines_and_counts_the_dropped(stack: Stack) -> None:
    url, job = stack.settings.database, _new(stack)
    line = "y" * 99  # 100 bytes with its newline
    for chunk in range(10):  # 1000 lines, 100,000 bytes, in chunks of 100
        logs.append(url, job, _lines([f"{chunk * 100 + i:04d} {line}"[:99] for i in range(100)]), LIMIT)
    items = logs.read(url, job, limit=logs.MOST_READ)["items"]
    stored = [x for x in items if not x["text"].startswith("[mxq]")]
    assert sum(len(x["text"].encode()) + 1 for x in stored) <= LIMIT
    notes = [x for x in items if x["text"].startswith("[mxq]")]
    assert len(notes) == 1
    note = notes[0]
    head = [x for x in items if x["seq"] < note["seq"]]
    assert [x["seq"] for x in head] == list(range(1, note["seq"]))  # the first lines, in order
    assert 0 < sum(len(x["text"]) + 1 for x in head) <= LIMIT // 2
    tail = [x for x in items if x["seq"] > note["seq"]]
    assert tail[-1]["seq"] == 1000 and tail[-1]["text"].startswith("0999")  # the latest line
    assert [x["seq"] for x in tail] == list(range(tail[0]["seq"], 1001))
    dropped = tail[0]["seq"] - note["seq"]
    assert note["text"].startswith(f"[mxq] {dropped} lines dropped here")
    assert len(head) + dropped + len(tail) == 1000


def test_a_writers_gap_is_numbered_never_stored_and_counted(stack: Stack) -> None:
    url, job = stack.settings.database, _new(stack)
    logs.append(url, job, [*_lines(["first"]), Gap(500), *_lines(["last"])], LIMIT)
    items = logs.read(url, job)["items"]
    assert [(x["seq"], x["text"]) for x in items] == [
        (1, "first"), (2, logs.dropped_note(500, LIMIT)), (502, "last")]


def test_the_rule_drops_the_oldest_of_the_tail_through_the_last_gap() -> None:
    # head 1-2 (half of 40 is 20: two lines of 10), then 3..6 and a gap of 2 lines at 7, then 9
    entries = [(1, 10), (2, 10), (3, 10), (4, 10), (5, 10), (6, 10), (7, None), (9, 10)]
    cut = logs.trim(entries, None, 10, 40)
    assert cut == logs.Trim(first=3, last=8, note_seq=3, dropped=6)
    assert logs.trim([(1, 10), (2, 10)], None, 3, 40) is None  # within the bound
    # a note at 3 already: the head is 1-2 whatever its size, the oldest after it go
    assert logs.trim([(1, 10), (2, 10), (5, 10), (6, 10), (7, 10)], 3, 8, 40) == \
        logs.Trim(first=5, last=5, note_seq=3, dropped=3)


@pytest.mark.parametrize("status", ["succeeded", "failed"])
def test_a_finished_jobs_log_ends_with_its_last_attempts_end(stack: Stack, status: str) -> None:
    url, job = stack.settings.database, _new(stack)
    assert not logs.read(url, job)["ended"]
    fence = jobs.take(url, job, jobs.Placement(worker="cpu0@n", node="n", device="cpu:0"), 3, 5.0)
    assert not isinstance(fence, jobs.Claim)
    if status == "succeeded":
        jobs.succeed(url, fence, 1, 0.1, {})
    else:
        jobs.fail(url, job, "boom", fence=fence)
    assert not logs.read(url, job)["ended"]  # its attempt's worker has not written its last line
    logs.append(url, job, _lines([logs.ended_note(1)], "mxq"), LIMIT)
    assert logs.read(url, job)["ended"]


def test_a_job_that_never_ran_has_an_ended_empty_log(stack: Stack) -> None:
    url, job = stack.settings.database, _new(stack)
    jobs.fail(url, job, "refused")
    assert logs.read(url, job) == {"items": [], "next": 0, "status": "failed", "ended": True}
