"""Which webhook URLs and addresses the sender may reach: a malformed URL or
port is one line of refusal (never a traceback or a 500), an IPv6 address that carries an IPv4
one (NAT64, 6to4, mapped, translated, compatible, Teredo, site-local) is never taken for public,
and httpx's own log never writes a hook's path or query."""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from mxq.api import routes
from mxq.api.app import app
from mxq.db.webhooks.outbox import Claimed
from mxq.workers.settings import HookAllowlist, Settings
from mxq.workers.webhooks import sender, targets
from tests.conftest import Stack
from tests.hooks.receiver import receiving

NAMED = HookAllowlist.parse("hooks.example.com")


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:0/x", "http://127.0.0.1:65536/x",
                                 "http://127.0.0.1:port/x", "https://hooks.example.com:0"])
def test_a_malformed_url_or_port_is_refused_in_one_line(url: str) -> None:
    with pytest.raises(targets.HookRefused) as refused:
        targets.endpoint(url, HookAllowlist.parse("127.0.0.1,hooks.example.com"))
    assert "\n" not in str(refused.value) and "1 to 65535" in str(refused.value)


@pytest.mark.parametrize("address", ["64:ff9b::7f00:1", "64:ff9b:1::a00:1", "::7f00:1", "::ffff:7f00:1",
                                     "::ffff:0:a00:1", "2002:7f00:1::1", "2001:0:4136:e378::1",
                                     "fec0::1"])
def test_a_name_resolving_to_an_ipv6_form_of_ipv4_is_refused(
        monkeypatch: pytest.MonkeyPatch, address: str) -> None:
    """hooks.example.com is listed by name, and resolves (here, by a stand-in for DNS) to an
    address a translator or tunnel delivers to an IPv4 host, 127.0.0.1 or 10.0.0.1 among them."""
    def dns(host: str, port: int, *args: Any, **kwargs: Any) -> list[tuple]:
        assert host == "hooks.example.com"
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0))]

    monkeypatch.setattr(socket, "getaddrinfo", dns)
    point = targets.endpoint("https://hooks.example.com/in", NAMED)
    with pytest.raises(targets.HookRefused, match=f"resolves to {address.split('::')[0]}"):
        targets.resolve(point, NAMED)
    # the same address is reached once the allowlist names its network
    opened = HookAllowlist.parse(f"hooks.example.com,{address}")
    assert str(targets.resolve(point, opened)) == str(ipaddress.ip_address(address))


def test_a_public_ipv6_address_is_still_reached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port, *a, **k: [
        (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("2606:4700::1111", port, 0, 0))])
    point = targets.endpoint("https://hooks.example.com/in", NAMED)
    assert str(targets.resolve(point, NAMED)) == "2606:4700::1111"


def test_httpx_never_logs_a_hooks_query(caplog: pytest.LogCaptureFixture) -> None:
    """Some services put a token in the URL's query: the delivery arrives with it, and no log
    line (httpx logs each request's URL at INFO) holds it."""
    caplog.set_level(logging.DEBUG)
    with receiving() as receiver:
        claimed = Claimed("dlv_" + "0" * 32, 1, "job.failed", {"job": {"id": 1}}, None, 1,
                          receiver.url("/ok?token=tok-7c1e4d"), "secret")
        code, error = sender.post(Settings(hook_allowed_hosts="127.0.0.1").webhooks, claimed)
        assert (code, error) == (200, None)
        assert [r.path for r in receiver.got] == ["/ok?token=tok-7c1e4d"]
    assert "tok-7c1e4d" not in caplog.text


@pytest.fixture
def api(isolated: Stack) -> Any:
    token = "hooks-target-admin-0123"
    s = isolated.settings.model_copy(update={"api_token": SecretStr(token),
                                          "hook_allowed_hosts": "127.0.0.1"})
    app.dependency_overrides[routes.settings] = lambda: s
    try:
        yield TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000),
                         headers={"Authorization": f"Bearer {token}"})
    finally:
        app.dependency_overrides.clear()


@pytest.mark.parametrize("url", ["http://[::1", "http://0", "http://127.0.0.1:0/x", "http://a:b@127.0.0.1/"])
def test_the_api_refuses_a_url_its_schema_does_not_allow_with_a_4xx(api: TestClient, url: str) -> None:
    """The schema states what a URL may be (issue 58: `http://0` was schema-valid, then refused),
    and the API refuses by it."""
    answer = api.post("/api/v1/hooks", json={"url": url, "events": ["job.failed"]})
    assert answer.status_code == 422, answer.text
    assert f"url={url!r}: String should match pattern" in answer.json()["detail"]
    assert re.fullmatch(targets.URL_PATTERN, url) is None


def test_a_url_the_schema_allows_is_refused_only_for_its_host(api: TestClient) -> None:
    """Added as the schema allows it: a listed loopback host on any port is accepted, an unlisted
    one refused naming MXQ_HOOK_ALLOWED_HOSTS."""
    ok = api.post("/api/v1/hooks", json={"url": "http://127.0.0.1:65535/in#x", "events": ["job.failed"]})
    assert ok.status_code in (200, 201), ok.text
    refused = api.post("/api/v1/hooks", json={"url": "http://hooks.example.com/", "events": ["job.failed"]})
    assert refused.status_code == 422 and "MXQ_HOOK_ALLOWED_HOSTS" in refused.json()["detail"]


def test_a_non_admin_is_told_what_the_hooks_routes_need(api: TestClient, isolated: Stack) -> None:
    """The 403 names the work (webhooks), not another route family's (an architecture's code)."""
    from mxq.db.sharing import users
    from mxq.users import Role

    name = f"hooker{uuid.uuid4().hex[:6]}"
    token = users.add(isolated.settings.database, name, Role.SUBMIT)
    for method, path in (("GET", "/api/v1/hooks"), ("DELETE", "/api/v1/hooks/1"),
                         ("GET", "/api/v1/hooks/deliveries")):
        answer = api.request(method, path, headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 403, answer.text
        assert f"user '{name}' has role submit; managing webhooks" in answer.json()["detail"]
        assert "architecture" not in answer.text
