"""Settings checked before they are used: URL schemes, finite bounded numbers, and a home whose
path is too long for a unix socket (issue 29, item 4). The table of hostile values is the
corpus in tests/bad_input/test_bad_input_settings.py; here, what lies around it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from mxq.cli.errors import settings_message
from mxq.workers.launch.embedded import EmbeddedRedis
from mxq.workers.settings import MAX_SOCKET_PATH, Settings, redis_socket_path
from tests.conftest import run_cli
from tests.support.messages import one_line


def _long_home(tmp_path: Path) -> Path:
    """A home of 100+ characters: its own redis.sock would not fit sun_path (108 bytes)."""
    home = tmp_path / ("h" * max(1, 110 - len(str(tmp_path))))
    assert len(str(home / "redis.sock")) > MAX_SOCKET_PATH
    return home


@pytest.mark.parametrize("url", ["sqlite:///x.db", "sqlite://", "postgresql://u@h/db",
                                 "postgresql+psycopg://u:p@h:5432/db", "postgres://h/db"])
def test_the_supported_databases_are_accepted(url: str) -> None:
    assert Settings(database_url=url).database == url


@pytest.mark.parametrize("url", ["redis://h:6379/0", "rediss://h:6380/0", "redis+socket:///tmp/r.sock"])
def test_the_supported_brokers_are_accepted(url: str) -> None:
    assert Settings(broker_url=url).broker == url


def test_several_bad_settings_are_still_one_line() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(heartbeat_seconds=float("inf"), tick_seconds="nan\nrm -rf /",
                 broker_url="ftp://x")
    message = settings_message(caught.value)
    assert len(message.splitlines()) == 1, message
    assert "MXQ_HEARTBEAT_SECONDS=inf" in message and "MXQ_BROKER_URL=ftp://x" in message
    assert "MXQ_TICK_SECONDS='nan\\nrm -rf /'" in message  # a value with a newline, quoted


def test_a_long_home_puts_the_socket_at_a_short_path(tmp_path: Path) -> None:
    home = _long_home(tmp_path)
    sock = redis_socket_path(home)
    assert len(os.fsencode(sock)) <= MAX_SOCKET_PATH and not sock.is_relative_to(home)
    assert redis_socket_path(home) == sock  # the same for every process of the home
    assert redis_socket_path(tmp_path / "other" / home.name) != sock  # one per home
    s = Settings(home=home)
    assert s.redis_socket == sock and EmbeddedRedis(home).socket == sock
    assert s.broker == f"redis+socket://{sock}"
    short = tmp_path / "short"
    assert redis_socket_path(short) == short.resolve() / "redis.sock"  # a short home keeps its own


def test_the_embedded_redis_of_a_long_home_starts_and_stops(tmp_path: Path) -> None:
    """Was: the socket path cut to `…/redis.`, `mxq up` failed, and the Redis it left running
    was one `mxq down` called "nothing was running"."""
    home = _long_home(tmp_path)
    redis = EmbeddedRedis(home)
    try:
        assert redis.start() and redis.running()
        assert redis.client().ping()
    finally:
        problem = redis.stop()
        gone = not redis.socket.parent.exists()  # its short folder removed with it
        shutil.rmtree(redis.socket.parent, ignore_errors=True)
    assert problem is None and not redis.running() and not redis.alive() and gone


def test_no_folder_fits_the_socket_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where neither the home nor any short folder holds the socket, refused before anything."""
    import tempfile

    deep = "/" + "d" * 120
    monkeypatch.setenv("XDG_RUNTIME_DIR", deep)
    monkeypatch.setattr(tempfile, "gettempdir", lambda: deep)
    monkeypatch.setattr("mxq.workers.settings.broker.tempfile.gettempdir", lambda: deep)
    monkeypatch.setattr("mxq.workers.settings.broker.FALLBACK_SOCKET_ROOT", deep)
    home = _long_home(tmp_path)
    result = run_cli(["devices"], {"MXQ_HOME": str(home)})
    line = one_line(result.stderr)
    assert result.returncode == 2 and line.startswith(f"mxq: error: MXQ_HOME={home}: "), line
    assert "use a shorter MXQ_HOME or set MXQ_BROKER_URL" in line
    assert not home.exists()
    assert Settings(home=home, broker_url="redis://h:6379/0").home == home  # no socket needed


def test_a_socket_folder_another_made_open_is_refused(tmp_path: Path) -> None:
    """The short folder's name is predictable: one open to others is not used."""
    from mxq.workers.launch.embedded import UnsafeSocketFolder

    home = _long_home(tmp_path)
    folder = redis_socket_path(home).parent
    folder.mkdir(mode=0o777, parents=True, exist_ok=True)
    folder.chmod(0o777)
    try:
        with pytest.raises(UnsafeSocketFolder, match="open to others"):
            EmbeddedRedis(home).start()
    finally:
        folder.rmdir()


# MXQ_NODE_ADDRESS (issue 30, finding 6): ps-lite binds the address it announces, through ZeroMQ,
# which binds only a numeric IPv4 address; anything else failed only at the first multi-node
# training, as ps-lite's "bind failed".

@pytest.mark.parametrize("value", ["10.0.0.7", "127.0.0.1", "192.168.1.20"])
def test_an_ipv4_node_address_is_accepted(value: str) -> None:
    assert Settings(node_address=value).address == value


def test_an_empty_node_address_is_unset() -> None:
    """Compose's `${VAR:-}` passes an empty value: the default (the default route's address)."""
    assert Settings(node_address="").node_address is None


@pytest.mark.parametrize("value", ["box2.lan", "localhost", "::1", "fe80::1", "0.0.0.0", "224.0.0.1",
                                   "255.255.255.255", "10.0.0.256", "10.0.0.7:9000", "010.0.0.7",
                                   " 10.0.0.7", "10.0.0.7\nrm -rf /"])
def test_a_node_address_that_is_not_an_ipv4_unicast_address_is_one_line(tmp_path: Path, value: str) -> None:
    home = tmp_path / "home"
    result = run_cli(["devices"], {"MXQ_HOME": str(home), "MXQ_NODE_ADDRESS": value})
    line = one_line(result.stderr)
    shown = value if value.isprintable() and " " not in value else repr(value)
    assert result.returncode == 2, result
    assert line.startswith(f"mxq: error: MXQ_NODE_ADDRESS={shown}: not a unicast IPv4 address; "
                           "allowed: an IPv4 address of this host that the other nodes reach"), line
    assert "no host name, IPv6, 0.0.0.0 or multicast" in line, line
    assert not home.exists()  # refused before anything started
