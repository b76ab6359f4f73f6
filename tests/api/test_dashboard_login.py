"""Logging in to the dashboard (issue 43), in real headless Chromium (Debian's `chromium`, as
test_dashboard.py): on a stack with users the page shows a login form and none of the data; a
wrong token shows the API's reason; a user's token opens the views, signed in as that user, with
a session cookie the page's script cannot read (HttpOnly) and the token kept nowhere; another's
job comes without its results; a session that ends sends the page back to the form; logging out
ends the session, across a reload.

The page is driven over Chromium's DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON
messages ending in a NUL byte, read by Chromium on its fd 3 and written on its fd 4), which needs
no client library: `_Tab`."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mxq.db.sharing import teams, users
from mxq.users import Role
from mxq.workers.jobs.submit import submit
from tests.api import test_dashboard as dashboard
from tests.conftest import Stack, missing, wait_until

pytestmark = pytest.mark.slow

api_url = dashboard.api_url  # the same fixture: `mxq api` on a free port of the stack
RUN = uuid.uuid4().hex[:6]  # a removed user's name is retired: names new to the stack
USER, PEER, TEAM = f"dana-{RUN}", f"erin-{RUN}", f"dash-{RUN}"
COOKIE = "mxq_session"
# test_dashboard's flags, less the virtual time budget of `--dump-dom`: this page runs in real time.
FLAGS = [flag for flag in dashboard.FLAGS if not flag.startswith("--virtual-time-budget")]
# What the page shows, read in one evaluation.
VIEW = """(() => {
  const $ = (id) => document.getElementById(id);
  return {
    login: !$("login-view").hidden, dashboard: !$("dashboard").hidden,
    rows: document.querySelectorAll("tbody tr").length,
    jobs: [...document.querySelectorAll("#jobs-table tr[data-job-id]")].map((tr) => Number(tr.dataset.jobId)),
    signed_in: $("whoami").hidden ? null : $("signed-in").textContent,
    error: $("login-error").textContent, token_field: $("login-token").value,
  };
})()"""
# What the page's script can see of where a token might be kept.
SEEN_BY_SCRIPT = "JSON.stringify([document.cookie, {...localStorage}, {...sessionStorage}])"
DETAIL = """(() => ({
  title: document.getElementById("job-title").textContent,
  fields: Object.fromEntries([...document.querySelectorAll("#job-fields dt")].map(
    (dt) => [dt.textContent, dt.nextElementSibling.textContent])),
}))()"""


class _Tab:
    """One tab of headless Chromium, driven over the DevTools protocol on a pipe."""

    def __init__(self, profile: Path, log: Path) -> None:
        exe = shutil.which("chromium")
        if exe is None:
            missing("Debian's chromium is not installed (`make test` installs it as root)")
        its_fd3, to_chromium = os.pipe()  # Chromium reads commands on its fd 3
        from_chromium, its_fd4 = os.pipe()  # and writes answers and events on its fd 4
        args = [exe, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"]
        with open(log, "wb") as out:  # bash, not sh: dash renumbers only fds 0 to 9
            self.proc = subprocess.Popen(["bash", "-c", f'exec "$@" 3<&{its_fd3} 4>&{its_fd4}',
                                          "chromium", *args],
                                         pass_fds=(its_fd3, its_fd4), stdout=out, stderr=subprocess.STDOUT)
        os.close(its_fd3)
        os.close(its_fd4)
        self._out, self._in = to_chromium, from_chromium
        self._buffer = b""
        self._last_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.browser("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.browser("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Runtime.enable")
        self.call("Page.enable")

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            assert left > 0, "Chromium did not answer in time"
            if select.select([self._in], [], [], left)[0]:
                chunk = os.read(self._in, 1 << 20)
                assert chunk, f"Chromium exited ({self.proc.poll()})"
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message

    def _send(self, method: str, params: dict[str, Any], session: str | None) -> dict[str, Any]:
        self._last_id += 1
        sent = self._last_id
        message: dict[str, Any] = {"id": sent, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._out, data):]
        deadline = time.monotonic() + 30
        while True:
            answer = self._message(deadline)
            if answer.get("id") != sent:
                self.events.append(answer)  # an event (or a late answer): kept for `exceptions`
                continue
            assert "error" not in answer, f"{method}: {answer['error']}"
            result: dict[str, Any] = answer.get("result", {})
            return result

    def browser(self, method: str, **params: Any) -> dict[str, Any]:
        """A command to the browser (Target.*, Storage.*)."""
        return self._send(method, params, None)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """A command to the tab."""
        return self._send(method, params, self._session)

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise awaited)."""
        answer = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        assert "exceptionDetails" not in answer, f"{expression}: {answer['exceptionDetails']}"
        return answer["result"].get("value")

    def until(self, expression: str, what: str, timeout: float = 30) -> Any:
        """Poll an expression until it is truthy; its value."""
        return wait_until(lambda: self.eval(expression), timeout, what, interval=0.2)

    def view(self) -> dict[str, Any]:
        value: dict[str, Any] = self.eval(VIEW)
        return value

    def view_until(self, check: str, what: str) -> dict[str, Any]:
        """The page's view once the page has answered and `check` (on `v`, the view) holds."""
        self.until(f"(() => {{ const v = {VIEW}; return {check}; }})()", what)
        return self.view()

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.until("document.readyState === 'complete' && location.href !== 'about:blank'",
                   f"{url} to load")

    def reload(self) -> None:
        self.eval("window.beforeReload = true")
        self.call("Page.reload", ignoreCache=True)
        self.until("document.readyState === 'complete' && window.beforeReload === undefined",
                   "the page to load again")

    def log_in(self, token: str) -> None:
        """Type the token into the form, as a user would, and press "Log in"."""
        self.eval('document.getElementById("login-token").focus()')
        self.call("Input.insertText", text=token)
        self.eval('document.getElementById("login-button").click()')

    def cookies(self) -> dict[str, dict[str, Any]]:
        return {c["name"]: c for c in self.browser("Storage.getCookies")["cookies"]}

    def exceptions(self) -> list[str]:
        """Uncaught exceptions (and unhandled rejections) of the page's script so far."""
        return [json.dumps(e["params"]["exceptionDetails"]) for e in self.events
                if e.get("method") == "Runtime.exceptionThrown"]

    def close(self) -> None:
        try:
            self.browser("Browser.close")
        except (AssertionError, OSError):
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        os.close(self._out)
        os.close(self._in)


@pytest.fixture
def token(workers: Stack) -> Iterator[str]:
    """A user (role submit) and its token: the stack now has users, so every read needs a login.
    Removed after: the stack is shared with tests that read without a token."""
    added = workers.mxq_json("users", "add", USER, "--role", "submit")
    try:
        yield added["token"]
    finally:
        if any(u["name"] == USER for u in users.list_users(workers.settings.database)):
            users.remove(workers.settings.database, USER)


@pytest.fixture
def tab(tmp_path: Path) -> Iterator[_Tab]:
    browser = _Tab(tmp_path / "profile", tmp_path / "chromium.log")
    try:
        yield browser
    finally:
        browser.close()


def test_the_dashboard_needs_a_login_once_users_exist(workers: Stack, token: str, api_url: str,
                                                      tab: _Tab) -> None:
    s = workers.settings
    users.add(s.database, PEER, Role.SUBMIT)
    teams.add_team(s.database, TEAM)
    for member in (USER, PEER):
        teams.set_member(s.database, TEAM, member)
    mine = submit(s, "probe", {"size": 16}, "cpu:0", owner=USER)
    others = submit(s, "probe", {"size": 16}, "cpu:1")  # this machine's local admin's
    shared = submit(s, "probe", {"size": 16}, "cpu:1", owner=PEER, team=TEAM)  # USER's team's
    try:
        for job_id in (mine, others, shared):
            assert workers.wait(job_id)["status"] == "succeeded"
        _check_login(tab, api_url, token, mine, others, shared)
    finally:
        users.remove(s.database, PEER)
        teams.remove_team(s.database, TEAM)


def _check_login(tab: _Tab, api_url: str, token: str, mine: int, others: int, shared: int) -> None:
    assert httpx.get(f"{api_url}api/v1/jobs").status_code == 401  # reads need a login now
    refused = httpx.post(f"{api_url}api/v1/session", json={"token": token + "x"})
    assert refused.status_code == 401
    assert refused.headers["content-type"].startswith("application/problem+json")
    _walk(tab, api_url, token, (mine, others, shared), refused.json()["detail"])


def _walk(tab: _Tab, api_url: str, token: str, jobs: tuple[int, int, int], wrong: str) -> None:
    """Through the login as a user would, with USER's `token`: of the finished probes `jobs`,
    the first is USER's, the second another owner's, the third PEER's shared with USER's team;
    `wrong` is what the API says of a wrong token."""
    mine, others, shared = jobs
    # Not logged in: the form, and nothing of the data.
    tab.navigate(api_url)
    view = tab.view_until("v.login", "the login form")
    assert not view["dashboard"] and view["rows"] == 0 and view["signed_in"] is None

    # A wrong token: the problem's detail, still the form.
    tab.log_in(token + "x")
    view = tab.view_until("v.error !== ''", "the login error")
    assert view["error"] == wrong
    assert view["login"] and view["rows"] == 0 and view["token_field"] == ""

    # The user's token: the views, signed in as the user; the token is kept nowhere, and the
    # session's cookie is out of the script's reach.
    tab.log_in(token)
    view = tab.view_until(f"v.jobs.includes({mine}) && v.jobs.includes({others})", "the jobs table")
    assert view["dashboard"] and not view["login"] and view["token_field"] == ""
    assert view["signed_in"] == f"signed in as {USER} (submit)"
    session = tab.cookies()[COOKIE]
    assert session["httpOnly"] and session["sameSite"] == "Strict" and session["path"] == "/"
    assert token not in session["value"]
    seen = tab.eval(SEEN_BY_SCRIPT)
    assert COOKIE not in seen and token not in seen

    # A job's results only where the user may read them: its own, not another's.
    tab.eval(f'location.hash = "job={mine}"')
    detail = tab.until(f"(() => {{ const d = {DETAIL}; return d.title === 'Job #{mine}' && "
                       f"d.fields.result ? d : null; }})()", f"job {mine}'s detail")
    assert "matmul_gflops" in detail["fields"]["result"]
    tab.eval(f'location.hash = "job={others}"')
    detail = tab.until(f"(() => {{ const d = {DETAIL}; return d.title === 'Job #{others}' && "
                       f"d.fields.result ? d : null; }})()", f"job {others}'s detail")
    assert detail["fields"]["result"].startswith("not shown") and "output" not in detail["fields"]
    tab.eval(f'location.hash = "job={shared}"')  # another's, shared with the user's team
    detail = tab.until(f"(() => {{ const d = {DETAIL}; return d.title === 'Job #{shared}' && "
                       f"d.fields.result ? d : null; }})()", f"job {shared}'s detail")
    assert "matmul_gflops" in detail["fields"]["result"]

    # A reload keeps the session (the page asks GET /session again)...
    tab.reload()
    view = tab.view_until(f"v.jobs.includes({mine})", "the jobs table after a reload")
    assert view["signed_in"] == f"signed in as {USER} (submit)"
    # ...and a session that ends (here its cookie goes) sends the page back to the form.
    tab.browser("Storage.clearCookies")
    view = tab.view_until("v.login", "the login form once the session ended")
    assert view["rows"] == 0 and not view["dashboard"] and "log in again" in view["error"]

    # Log in again, reload (the page learns the CSRF token anew), and log out with it.
    tab.log_in(token)
    tab.view_until(f"v.jobs.includes({mine})", "the jobs table")
    tab.reload()
    tab.view_until(f"v.jobs.includes({mine})", "the jobs table after a reload")
    tab.eval('document.getElementById("logout").click()')
    view = tab.view_until("v.login", "the login form after logging out")
    assert view["rows"] == 0 and view["signed_in"] is None and view["error"] == ""
    assert COOKIE not in tab.cookies()
    tab.reload()
    view = tab.view_until("v.login", "the login form after a reload")
    assert view["rows"] == 0 and not view["dashboard"]
    assert tab.exceptions() == []
