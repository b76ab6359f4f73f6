"""The client: `Client(url, token=…)` submits jobs (each a `Job`, `mxq.client.job`), reads their
history and predictions over the HTTP API (`/api/v1`, typed in its OpenAPI description), and
raises the API's errors as mxq's own (`mxq.errors`: NotFound, Conflict, UserError, JobRejected
with its job id, Unavailable, Unauthorized for a 401: no token or a wrong one, Forbidden for a
403: the token's user may not do this, such as a `read` user's submit or a cancel of another
user's job). Forbidden is a subclass of Unauthorized, so catch Forbidden first to tell them
apart; both are MxqErrors.

It needs only httpx (and NumPy, pyarrow or pandas for the predictions' format asked): pipeline
code in Airflow, Prefect or Dagster calls it as plain Python.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from mxq.client.answers import json_object, json_objects
from mxq.client.job import Job
from mxq.errors import (
    Conflict,
    Forbidden,
    JobRejected,
    MxqError,
    NotFound,
    Unauthorized,
    Unavailable,
    UserError,
)
from mxq.json_types import JsonObject, JsonValue

Query = Mapping[str, str | int | float | bool | None]  # a request's query parameters

POLL_SECONDS = 0.5  # how often `Job.wait` asks again, unless the Client says (`poll_seconds`)
JOBS_PAGE = 1000  # jobs fetched per request (the API's most)
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8470  # mxq's own defaults (MXQ_API_HOST, MXQ_API_PORT)
STACK_RECORD = "stack.json"  # what `mxq up` records in $MXQ_HOME (workers/stack_record.record_stack)
WILDCARDS = ("0.0.0.0", "::", "")  # an API bound to every interface is reached on loopback
FIRST_BEFORE_ID = 2**31 - 1  # `before_id` of a walk's first page: above every id (mxq.names.MAX_ID)


def _error(answer: httpx.Response) -> MxqError:
    """The API's problem document as the matching mxq error: 401 (who are you?) and 403 (you
    may not) apart, since a script fixes them differently (a token, or a role or owner)."""
    try:
        parsed: JsonValue = answer.json()
    except ValueError:
        parsed = None
    body = parsed if isinstance(parsed, dict) else {"detail": answer.text[:300]}
    detail = str(body.get("detail", answer.reason_phrase))
    status = answer.status_code
    job_id = body.get("job_id")
    if status == 422 and isinstance(job_id, int):
        return JobRejected(job_id, detail.removeprefix(f"job {job_id} failed: "))
    kinds: dict[int, type[MxqError]] = {401: Unauthorized, 403: Forbidden, 404: NotFound,
                                        409: Conflict, 503: Unavailable}
    return kinds.get(status, UserError if 400 <= status < 500 else MxqError)(detail)


def _recorded_api(home: Path) -> tuple[str | None, int | None]:
    """The API host and port `mxq up` recorded in this home's stack.json (read as plain JSON:
    the client imports nothing of the stack's own)."""
    try:
        record = json.loads((home / STACK_RECORD).read_text())
    except (OSError, ValueError):
        return None, None
    if not isinstance(record, dict):
        return None, None
    host, port = record.get("api_host"), record.get("api_port")
    return (host if isinstance(host, str) else None), (port if isinstance(port, int) else None)


def stack_url(env: Mapping[str, str] | None = None) -> str:
    """The URL of the API of this shell's stack, found as the `mxq` command finds it: the
    address `MXQ_API_HOST` / `MXQ_API_PORT` set, else the one `mxq up` recorded in
    `$MXQ_HOME/stack.json` (home `./var` by default), else http://127.0.0.1:8470."""
    env = os.environ if env is None else env
    host, port = _recorded_api(Path(env.get("MXQ_HOME") or "var"))
    host = env.get("MXQ_API_HOST") or host or DEFAULT_HOST
    text = env.get("MXQ_API_PORT")
    try:
        port = int(text) if text else (port or DEFAULT_PORT)
    except ValueError:
        raise UserError(f"MXQ_API_PORT={text!r} is not a port: use 1 to 65535") from None
    host = DEFAULT_HOST if host in WILDCARDS else host
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class Client:
    """One mxq API and its token, when it has one. With no `url` (e.g. http://127.0.0.1:8470):
    the API of this shell's stack (`stack_url`), with `MXQ_API_TOKEN` unless `token` is given.

    Safe to share across threads: each thread that calls it gets its own HTTP connection pool
    (an httpx.Client, made on its first call), so no connection is ever used by two threads at
    once. `close` closes them all."""

    def __init__(self, url: str | None = None, token: str | None = None,
                 timeout: float = 60.0, poll_seconds: float = POLL_SECONDS) -> None:
        if url is None:  # this shell's stack, and its token as the CLI would use it
            url = stack_url()
            token = token if token is not None else os.environ.get("MXQ_API_TOKEN") or None
        self.base_url = url.rstrip("/") + "/api/v1"
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout
        self.poll_seconds = poll_seconds  # how often `Job.wait` asks the API again
        self._local = threading.local()
        self._lock = threading.Lock()
        self._opened: list[httpx.Client] = []

    @property
    def http(self) -> httpx.Client:
        """This thread's HTTP client."""
        http: httpx.Client | None = getattr(self._local, "http", None)
        if http is None:
            http = httpx.Client(base_url=self.base_url, headers=self._headers, timeout=self._timeout)
            with self._lock:
                self._opened.append(http)
            self._local.http = http
        return http

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, []
        for http in opened:
            http.close()
        self._local = threading.local()

    def request(self, method: str, path: str, params: Query | None = None,
                json: object = None, headers: Mapping[str, str] | None = None) -> JsonValue:
        """One call; the decoded JSON, or the API's error raised."""
        try:
            answer = self.http.request(method, path, params=params, json=json, headers=headers)
        except httpx.TransportError as exc:
            raise Unavailable(f"mxq API at {self.base_url} unreachable: {exc}") from None
        if answer.status_code >= 400:
            raise _error(answer)
        decoded: JsonValue = answer.json() if answer.content else None
        return decoded

    def download(self, path: str, **params: str | int) -> httpx.Response:
        """One GET whose answer is a file, not JSON; the API's error raised."""
        try:
            answer = self.http.request("GET", path, params=params)
        except httpx.TransportError as exc:
            raise Unavailable(f"mxq API at {self.base_url} unreachable: {exc}") from None
        if answer.status_code >= 400:
            raise _error(answer)
        return answer

    def submit(self, kind: str, wait: bool = False, idempotency_key: str | None = None,
               priority: str = "normal", preemptible: bool | None = None,
               after: Sequence[int | Job] | None = None, **params: object) -> Job:
        """Queue a job of `kind` (the options of `mxq KIND`; `device` routes it) at `priority`
        (high, normal or low; `preemptible`: may it yield to a waiting job of a higher level,
        None: only low jobs do). `infer`, `train` and `probe` take both as options too.

        With `idempotency_key` (such as str(uuid.uuid4()), kept for the retries), a retry of a
        submit whose answer was lost returns the job the first one made (`Job.replayed`)
        instead of queuing a second; the same key with other parameters raises Conflict (keys
        are the token's user's own). `team="ml"` shares the job's results with a team of the
        user's: its members read them, everyone else sees the job without its `result` and is
        refused its predictions (Forbidden). `time_limit` (seconds, or a duration such as "90s",
        "45m", "2h", "1h30m") bounds the job from its first start, across attempts: past it the
        job stops at its next checkpoint, keeps what it committed and fails naming the limit.
        `after=[12, job]` (ids or `Job`s, `mxq KIND --after 12,15`) makes the job wait until
        those succeeded: it fails, naming the one, if one fails or is cancelled."""
        return self._queue(kind, wait, idempotency_key, {
            "priority": priority, "preemptible": preemptible, "after": after, **params})

    def _queue(self, kind: str, wait: bool, idempotency_key: str | None,
               params: Mapping[str, object]) -> Job:
        """`submit` with its options in one mapping, so that the kinds' own methods pass theirs
        (`priority`, `preemptible` and `after` among them) along as they came."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else None
        body: dict[str, object] = {"kind": kind, "priority": "normal", **params}
        if body.get("preemptible") is None:
            body.pop("preemptible", None)
        after = body.pop("after", None)
        if isinstance(after, Sequence):
            body["after"] = [j.id if isinstance(j, Job) else j for j in after]
        elif after is not None:
            body["after"] = after
        job = Job(self, json_object(self.request("POST", "/jobs", json=body, headers=headers)))
        return job.wait() if wait else job

    def infer(self, model: str, input: str, device: str = "auto", wait: bool = False,
              idempotency_key: str | None = None, **options: object) -> Job:
        """Bulk inference of `model` (NAME or NAME:VERSION) over `input` (inside the data root)."""
        return self._queue("infer", wait, idempotency_key,
                           {"model": model, "input": input, "device": device, **options})

    def train(self, arch: str, dataset: str, name: str, device: str = "auto", wait: bool = False,
              idempotency_key: str | None = None, **options: object) -> Job:
        """Data-parallel training of `arch` on `dataset`; registers a version of `name`."""
        return self._queue("train", wait, idempotency_key, {
            "arch": arch, "dataset": dataset, "name": name, "device": device, **options})

    def retrain(self, model: str, dataset: str, name: str | None = None, version: int | None = None,
                reinit: bool = False, device: str = "auto", wait: bool = False,
                idempotency_key: str | None = None, **options: object) -> Job:
        """Data-parallel training of a registered model's own graph (`version`, else its promoted
        one) on `dataset`, from its weights (or fresh ones: `reinit`), with its preprocessing;
        registers the next version of `name` (default: `model`). `mxq train --from`."""
        return self._queue("train", wait, idempotency_key, {
            "from_model": model, "from_version": version, "reinit": reinit, "dataset": dataset,
            "device": device, "name": name or "", **options})

    def add_arch(self, name: str, path: str | Path, factory: str, input_shape: list[int],
                 classes: int = 10, wait: bool = False) -> Job:
        """Register the Python file at `path` as architecture `name` (`mxq arch add`; the token
        must be an admin's): the `arch` job that tries it on a device worker. Once it succeeded,
        its `result["arch"]` is the registered version and `train(name, …)` trains it; a refused
        trial fails it with its one-line `error`."""
        file = Path(path)
        job = Job(self, json_object(self.request("POST", "/archs", json={
            "name": name, "code": file.read_text(), "file_name": file.name, "factory": factory,
            "classes": classes, "input_shape": list(input_shape)})))
        return job.wait() if wait else job

    def archs(self) -> list[JsonObject]:
        """Every registered architecture's versions (`mxq arch ls`)."""
        return json_objects(self.request("GET", "/archs"))

    def schedule_inference(self, name: str, model: str, input: str, cron: str | None = None,
                           every: str | None = None, rescore: str | None = "low",
                           **options: object) -> JsonObject:
        """An inference schedule (`mxq schedule add NAME --infer MODEL --input GLOB`): at each
        `cron` time or `every` interval ("10m"), score each file of `input` that `model`'s
        version (its promoted one, or "NAME:VERSION") has not scored yet, a job each, with the
        options of `infer`; `rescore`: the level at which a promotion re-scores them (None: not
        on promotion). Returns the schedule's record."""
        body = {"name": name, "model": model, "input": input, "cron": cron, "every": every,
                "rescore": rescore, **options}
        return json_object(self.request("POST", "/schedules/inference", json=body))

    def schedule(self, name: str) -> JsonObject:
        """One schedule and its fires (an inference fire's `jobs`: one per file it scored)."""
        return json_object(self.request("GET", f"/schedules/{name}"))

    def unscored(self, schedule: str, version: int | None = None) -> JsonObject:
        """The files of an inference schedule's input whose bytes `version` (default: the one
        it scores with now) has not scored (`mxq lineage --unscored`): {schedule, version, inputs}."""
        query = {"version": version} if version is not None else {}
        return json_object(self.request("GET", f"/schedules/{schedule}/unscored", params=query))

    def lineage(self, model: str | None = None, version: int | None = None,
                output: str | None = None, limit: int = 1000, after: int = 0) -> list[JsonObject]:
        """What produced prediction sets (`mxq lineage --model`/`--output`): those `model`'s
        `version` produced, or the one whose output is `output`, each filter narrowing (none:
        every set the token's user may read), by job id above `after`, at most `limit` (pass
        the last one's `job_id` as `after` to read on); a job's own is `Job.lineage()`."""
        query = {k: v for k, v in {"model": model, "version": version, "output": output}.items()
                 if v is not None}
        return json_objects(self.request("GET", "/lineage", params={**query, "limit": limit, "after": after}))

    def add_hook(self, url: str, events: list[str]) -> JsonObject:
        """Add a webhook endpoint for `events` (`mxq hooks add`; the token must be an admin's):
        the answer's `secret` signs its deliveries and is not shown again."""
        return json_object(self.request("POST", "/hooks", json={"url": url, "events": list(events)}))

    def hooks(self) -> list[JsonObject]:
        """Every webhook endpoint (`mxq hooks ls`), without secrets."""
        return json_objects(self.request("GET", "/hooks"))

    def remove_hook(self, hook_id: int) -> None:
        """Forget a webhook endpoint and its deliveries (`mxq hooks rm`)."""
        self.request("DELETE", f"/hooks/{hook_id}")

    def deliveries(self, hook_id: int | None = None, status: str | None = None,
                   limit: int = 100) -> list[JsonObject]:
        """Webhook deliveries, newest first (`mxq hooks deliveries`)."""
        query = {k: v for k, v in {"hook_id": hook_id, "status": status}.items() if v is not None}
        return json_objects(self.request("GET", "/hooks/deliveries", params={**query, "limit": limit}))

    def redeliver(self, delivery_id: str) -> JsonObject:
        """Send a webhook delivery again now, with the same delivery id (`mxq hooks redeliver`)."""
        return json_object(self.request("POST", f"/hooks/deliveries/{delivery_id}/redeliver"))

    def probe(self, device: str = "auto", wait: bool = False, idempotency_key: str | None = None,
              **options: object) -> Job:
        return self._queue("probe", wait, idempotency_key, {"device": device, **options})

    def job(self, job_id: int) -> Job:
        return Job(self, json_object(self.request("GET", f"/jobs/{job_id}")))

    def jobs(self, status: str | None = None, since: str | None = None, kind: str | None = None,
             device: str | None = None, node: str | None = None, limit: int = 50) -> list[Job]:
        """Job history, newest (highest id) first, filtered as `mxq jobs` filters it (`since`:
        2h, 1d, an ISO time); at most `limit`, fetched a page of 1,000 at a time by id (keyset
        paging: jobs submitted meanwhile are neither repeated nor shift the pages)."""
        query = {k: v for k, v in {"status": status, "since": since, "kind": kind,
                                   "device": device, "node": node}.items() if v is not None}
        found: list[Job] = []
        before = FIRST_BEFORE_ID
        while len(found) < limit:
            asked = min(JOBS_PAGE, limit - len(found))
            page = json_object(self.request("GET", "/jobs", params={**query, "before_id": before,
                                                                "limit": asked}))
            items = json_objects(page["items"])
            found += [Job(self, r) for r in items]
            if len(items) < asked:
                break
            before = found[-1].id
        return found

    def cancel(self, job_id: int) -> Job:
        """Cancel: at once if queued, at the next batch or epoch if running."""
        return Job(self, json_object(self.request("POST", f"/jobs/{job_id}/cancel")))
