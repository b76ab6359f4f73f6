"""`--after` in SQL, the broker and the job frame (run directly, as tests/jobs/test_runner.py
does: no Celery worker, no sleep), on SQLite and PostgreSQL: a waiting job is held until its
jobs succeeded, fails naming the one that did not, down a chain too, whether or not admission
is on; bad ids are refused at submit through the CLI and the API, writing nothing."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import func, select

from mxq.api import routes
from mxq.api.app import app
from mxq.db.engine import session_scope
from mxq.db.jobs import Placement
from mxq.db.schema import Job
from mxq.db.sharing import admission, users
from mxq.db.webhooks import endpoints, outbox
from mxq.shares import Share
from mxq.status import MOST_AFTER
from mxq.tasks.job_context import JobContext, JobInputError, Outcome
from mxq.tasks.runner import Delivery, Worker, run_job
from mxq.users import Role
from mxq.workers.broker.messages import in_broker
from mxq.workers.broker.queues import device_queue
from mxq.workers.jobs import admit
from mxq.workers.jobs.cancel import cancel_job
from mxq.workers.jobs.jobspecs import ParamsError
from mxq.workers.jobs.queue_view import queue_view
from mxq.workers.jobs.submit import Submitted, submit_request
from mxq.workers.repair.reconcile import reconcile
from tests.conftest import NODE, Stack

pytestmark = pytest.mark.both_legs  # guarded UPDATEs, JSON lists and COPY differ per backend
AT = Placement(worker=f"cpu0@{NODE}", node=NODE, device="cpu:0")
QUEUE = device_queue(NODE, "cpu", 0)
ADMIN_TOKEN = "after-admin-token-0123"
_runs = itertools.count(1)


def _submit(stack: Stack, after: list[int] | None = None, owner: str | None = None) -> Submitted:
    return submit_request(stack.settings, "probe", {"size": 16}, "cpu:0", allow_offline=True,
                          owner=owner, after=after)


def _run(stack: Stack, job_id: int, error: str | None = None) -> Delivery | object:
    """One delivery of the job through the frame and its hooks (the dependency pass included)."""
    def body(job: JobContext) -> Outcome:
        if error is not None:
            raise JobInputError(error)
        return Outcome(samples=1, seconds=0.01, result={})

    return run_job(job_id, body, worker=Worker(AT, stack.settings, heartbeat=None))


def _published(stack: Stack) -> set[int]:
    return in_broker(stack.settings.broker, {QUEUE})[0]


def _why(stack: Stack, job_id: int) -> str:
    return next(e["why"] for e in queue_view(stack.settings) if e["id"] == job_id)


def test_b_after_a_is_held_until_a_succeeded_then_runs(isolated: Stack) -> None:
    a = _submit(isolated).job_id
    b = _submit(isolated, after=[a])
    assert b.published is False and f"waits for job {a} (--after)" in (b.note or "")
    assert isolated.job(b.job_id)["after"] == [a] and isolated.job(a)["after"] is None
    assert b.job_id not in _published(isolated)
    assert _why(isolated, b.job_id) == f"waits for job {a} (--after)"
    assert reconcile(isolated.settings).republished == []  # held: it has no message, and is not lost
    assert b.job_id not in _published(isolated)

    assert _run(isolated, a) is Delivery.SUCCEEDED  # its end decides b: released and published
    assert b.job_id in _published(isolated)
    assert _run(isolated, b.job_id) is Delivery.SUCCEEDED
    first, then = isolated.job(a), isolated.job(b.job_id)
    assert then["started_at"] is not None and first["finished_at"] is not None
    assert then["started_at"] >= first["finished_at"]


def test_a_job_after_finished_jobs_goes_at_once(isolated: Stack) -> None:
    a = _submit(isolated).job_id
    assert _run(isolated, a) is Delivery.SUCCEEDED
    b = _submit(isolated, after=[a, a])  # each once
    assert b.published is True and isolated.job(b.job_id)["after"] == [a]


def test_b_after_a_failing_fails_naming_a(isolated: Stack) -> None:
    hook = endpoints.add_hook(isolated.settings.database, "https://hooks.example.com/in",
                              ["job.failed"], "admin")
    a = _submit(isolated).job_id
    b = _submit(isolated, after=[a]).job_id
    assert _run(isolated, a, "input x.npy has NaN in sample 3\nsecond line") is Delivery.FAILED
    record = isolated.job(b)
    assert (record["status"], record["error"], record["attempts"]) == (
        "failed", f"job {a} it waits for (--after) failed: input x.npy has NaN in sample 3", 0)
    assert b not in _published(isolated)
    told = outbox.list_deliveries(isolated.settings.database, hook["id"], None, 100)
    assert sorted((d["event"], d["payload"]["job"]["id"]) for d in told) == [
        ("job.failed", a), ("job.failed", b)]  # failed by the --after pass: told as any failure


def test_a_failure_runs_down_a_chain_of_three(isolated: Stack) -> None:
    a = _submit(isolated).job_id
    b = _submit(isolated, after=[a]).job_id
    c = _submit(isolated, after=[b]).job_id
    assert _why(isolated, c) == f"waits for job {b} (--after)"
    assert _run(isolated, a, "bad input") is Delivery.FAILED  # one pass decides the whole chain
    assert isolated.job(b)["error"] == f"job {a} it waits for (--after) failed: bad input"
    assert isolated.job(c)["error"] == (f"job {b} it waits for (--after) failed: job {a} it "
                                        "waits for (--after) failed: bad input")
    assert {isolated.job(i)["status"] for i in (b, c)} == {"failed"}


def test_after_a_cancelled_job_and_cancelling_a_waiting_one(isolated: Stack) -> None:
    a = _submit(isolated).job_id
    b = _submit(isolated, after=[a]).job_id
    cancel_job(isolated.settings, a)
    assert isolated.job(b)["error"] == f"job {a} it waits for (--after) was cancelled"

    x = _submit(isolated).job_id
    y = _submit(isolated, after=[x]).job_id
    cancel_job(isolated.settings, y)  # a waiting job is cancelled as any queued one
    assert isolated.job(y)["status"] == "cancelled"
    assert _run(isolated, x) is Delivery.SUCCEEDED
    assert isolated.job(y)["status"] == "cancelled" and y not in _published(isolated)


def test_with_admission_on_a_waiting_job_takes_no_turn_until_its_wait_ends(isolated: Stack) -> None:
    s = isolated.settings
    users.add(s.database, "fair-after", Role.SUBMIT, Share(2.0))
    assert admit.holding(s)
    a = _submit(isolated, owner="fair-after")
    b = _submit(isolated, after=[a.job_id], owner="fair-after").job_id
    assert a.published is True  # admitted at its submit
    assert b not in {h.id for h in admission.held(s.database, 100)}  # not fair share's waiting work
    assert b not in admit.reasons(s) and _why(isolated, b) == f"waits for job {a.job_id} (--after)"
    assert _run(isolated, a.job_id) is Delivery.SUCCEEDED  # its end: the wait ends, the admitter releases
    assert b in _published(isolated)
    assert _run(isolated, b) is Delivery.SUCCEEDED


def _jobs(stack: Stack) -> int:
    with session_scope(stack.settings.database) as session:
        return int(session.scalar(select(func.count()).select_from(Job)) or 0)


def test_bad_ids_are_refused_at_submit_in_one_line_writing_nothing(isolated: Stack) -> None:
    s = isolated.settings
    a = _submit(isolated, owner="local:someone").job_id
    users.add(s.database, "alice-after", Role.SUBMIT)
    before = _jobs(isolated)
    refused = {
        "unknown": ([10**6], "--after 1000000: no such job; allowed: jobs submitted before this one"),
        "itself": ([a + 1], f"--after {a + 1}: no such job; allowed: jobs submitted before this one "
                            "(a job cannot wait for itself or for a later job)"),
        "zero": ([0], "--after 0: allowed: job ids, whole numbers from 1 to 2147483647"),
        "text": (["12"], "--after '12': allowed: job ids"),
        "bool": ([True], "--after True: allowed: job ids"),
        "too many": (list(range(1, MOST_AFTER + 2)), f"--after lists {MOST_AFTER + 1} jobs: allowed: "
                                                      f"at most {MOST_AFTER}"),
        "unreadable": ([a], f"--after {a}: user 'alice-after' may not read job {a} (of local:someone)"),
    }
    for why, (after, message) in refused.items():
        with pytest.raises(ParamsError) as exc:
            _submit(isolated, after=after, owner="alice-after")  # type: ignore[arg-type]
        assert str(exc.value).startswith(message) and "\n" not in str(exc.value), why
    assert _jobs(isolated) == before


def test_a_job_named_twice_counts_once(isolated: Stack) -> None:
    """64 distinct jobs in 65 entries (docs/dependencies.md: a job named twice counts once)."""
    ids = [_submit(isolated).job_id for _ in range(MOST_AFTER)]
    waiting = _submit(isolated, after=[*ids, ids[0]])
    assert isolated.job(waiting.job_id)["after"] == ids


def test_the_cli_takes_after_and_refuses_what_is_not_ids(isolated: Stack) -> None:
    a = _submit(isolated).job_id
    done = isolated.mxq_json("probe", "--device", "cpu:0", "--allow-offline", "--after", f"{a}")
    assert done["after"] == [a] and done["published"] is False and "--after" in done["note"]
    for value, said in (("x", "expected job ids"), ("1,,2", "expected job ids"),
                        ("999999", "no such job")):
        proc = isolated.mxq("probe", "--device", "cpu:0", "--allow-offline", "--after", value)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr


@pytest.fixture
def api(isolated: Stack) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """The API app on the stack, with the admin token and two users of their own."""
    s = isolated.settings.model_copy(update={"api_token": SecretStr(ADMIN_TOKEN)})
    app.dependency_overrides[routes.settings] = lambda: s
    run = next(_runs)
    made = {who: users.add(s.database, f"{who}-a{run}", Role.SUBMIT) for who in ("ann", "ben")}
    try:
        yield TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000)), made
    finally:
        app.dependency_overrides.clear()


def test_the_api_takes_after_and_refuses_bad_ids(isolated: Stack,
                                                 api: tuple[TestClient, dict[str, str]]) -> None:
    client, made = api

    def post(who: str, after: object, key: str | None = None) -> tuple[int, dict[str, object]]:
        headers = {"Authorization": f"Bearer {made[who]}", **({"Idempotency-Key": key} if key else {})}
        r = client.post("/api/v1/jobs", headers=headers, json={
            "kind": "probe", "device": "cpu:0", "allow_offline": True, "size": 16, "after": after})
        return r.status_code, r.json()

    status, first = post("ann", None)
    assert status == 201 and first["after"] is None
    a = int(str(first["id"]))
    status, waiting = post("ann", [a], key="after-key-1")
    assert status == 201 and waiting["after"] == [a] and waiting["published"] is False
    assert post("ann", [a], key="after-key-1")[1]["id"] == waiting["id"]  # a replay
    assert post("ann", [], key="after-key-1")[0] == 409  # the same key, another request (no wait)
    before = _jobs(isolated)
    for after in (["x"], [0], [-3], [1.5], [True], list(range(1, MOST_AFTER + 2)), "12"):
        assert post("ann", after)[0] == 422, after  # the schema's: nothing recorded
    status, problem = post("ann", [10**6])
    assert status == 422 and "--after 1000000: no such job" in str(problem["detail"])
    status, problem = post("ben", [a])  # ann's job, shared with no team
    assert status == 422 and f"may not read job {a}" in str(problem["detail"])
    assert _jobs(isolated) == before
