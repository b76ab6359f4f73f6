"""The bad-input corpus for settings: hostile or mistyped `MXQ_*` values. Each case runs a real
command in this process (`tests.conftest.run_cli`) and must end in one line on stderr,
`mxq: error: MXQ_X=value: …` naming what is allowed, exit status 2, no traceback, and nothing
written to the home (no database, no broker socket: refused before anything starts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.support.messages import one_line

SCHEMES_DB = "allowed schemes: sqlite, postgresql, postgresql+psycopg, postgres"
SCHEMES_BROKER = "allowed schemes: redis, rediss, redis+socket"
FINITE = "Input should be a finite number"
DIGITS_400 = "9" * 400


@dataclass(frozen=True)
class SettingCase:
    env: dict[str, str]
    needle: str  # in the one line, after `mxq: error: `
    args: tuple[str, ...] = ("devices",)


def case(name: str, value: str, needle: str, *, args: tuple[str, ...] = ("devices",),
         **more: str) -> SettingCase:
    return SettingCase({name: value, **more}, needle, args)


SETTING_CASES: dict[str, SettingCase] = {
    # URLs: a scheme mxq cannot run with, or no URL at all (was: ArgumentError, ModuleNotFoundError)
    "database not a url":
        case("MXQ_DATABASE_URL", "notaurl",
             f"MXQ_DATABASE_URL=notaurl: not a URL; {SCHEMES_DB}"),
    "database mysql":
        case("MXQ_DATABASE_URL", "mysql://u@h/db",
             f"MXQ_DATABASE_URL=mysql://u@h/db: scheme 'mysql' is not supported; {SCHEMES_DB}"),
    "database asyncpg, password hidden":
        case("MXQ_DATABASE_URL", "postgresql+asyncpg://u:hunter2@h/db",
             "MXQ_DATABASE_URL=postgresql+asyncpg://u@h/db: scheme 'postgresql+asyncpg'"),
    "database bare word sqlite":
        case("MXQ_DATABASE_URL", "sqlite",
             f"MXQ_DATABASE_URL=sqlite: not a URL; {SCHEMES_DB}"),
    "database empty": case("MXQ_DATABASE_URL", "", f"MXQ_DATABASE_URL=: not a URL; {SCHEMES_DB}"),
    "database bad port":
        case("MXQ_DATABASE_URL", "postgresql://u@h:port/db",
             "MXQ_DATABASE_URL=postgresql://u@h:port/db: Port could not be cast"),
    # (was: ValueError from kombu at `mxq devices`)
    "broker ftp":
        case("MXQ_BROKER_URL", "ftp://x",
             f"MXQ_BROKER_URL=ftp://x: scheme 'ftp' is not supported; {SCHEMES_BROKER}"),
    "broker amqp":
        case("MXQ_BROKER_URL", "amqp://guest:pw@localhost//",
             f"MXQ_BROKER_URL=amqp://guest@localhost//: scheme 'amqp' is not supported; {SCHEMES_BROKER}"),
    "broker host:port":
        case("MXQ_BROKER_URL", "localhost:6379",
             f"MXQ_BROKER_URL=localhost:6379: not a URL; {SCHEMES_BROKER}"),
    "broker bad port":
        case("MXQ_BROKER_URL", "redis://h:99999999999/0",
             "MXQ_BROKER_URL=redis://h:99999999999/0: Port out of range"),
    # Seconds: finite and bounded (was: OverflowError on inf or 1e308)
    "heartbeat inf":
        case("MXQ_HEARTBEAT_SECONDS", "inf",
             f"MXQ_HEARTBEAT_SECONDS=inf: {FINITE} (allowed: > 0 and <= 3600)"),
    "heartbeat 1e308":
        case("MXQ_HEARTBEAT_SECONDS", "1e308",
             "MXQ_HEARTBEAT_SECONDS=1e308: Input should be less than or equal to 3600"),
    "heartbeat nan": case("MXQ_HEARTBEAT_SECONDS", "nan", f"MXQ_HEARTBEAT_SECONDS=nan: {FINITE}"),
    "heartbeat negative":
        case("MXQ_HEARTBEAT_SECONDS", "-1",
             "MXQ_HEARTBEAT_SECONDS=-1: Input should be greater than 0"),
    "tick inf":
        case("MXQ_TICK_SECONDS", "inf",
             f"MXQ_TICK_SECONDS=inf: {FINITE} (allowed: > 0 and <= 86400)"),
    "reconcile 1e400": case("MXQ_RECONCILE_SECONDS", "1e400", f"MXQ_RECONCILE_SECONDS=1e400: {FINITE}"),
    "stall 1e308":
        case("MXQ_STALL_SECONDS", "1e308",
             "MXQ_STALL_SECONDS=1e308: Input should be less than or equal to 2592000"),
    "cancel grace -inf": case("MXQ_CANCEL_GRACE_SECONDS", "-inf", f"MXQ_CANCEL_GRACE_SECONDS=-inf: {FINITE}"),
    "glob seconds 1e9":
        case("MXQ_GLOB_SECONDS", "1e9",
             "MXQ_GLOB_SECONDS=1e9: Input should be less than or equal to 3600"),
    "device hang 0.5":
        case("MXQ_DEVICE_HANG_SECONDS", "0.5",
             "MXQ_DEVICE_HANG_SECONDS=0.5: Input should be greater than or equal to 1"),
    "device hang factor 1":
        case("MXQ_DEVICE_HANG_FACTOR", "1",
             "MXQ_DEVICE_HANG_FACTOR=1: Input should be greater than or equal to 2"),
    "start check 1e9":
        case("MXQ_START_CHECK_SECONDS", "1e9",
             "MXQ_START_CHECK_SECONDS=1e9: Input should be less than or equal to 3600"),
    "dist start nan": case("MXQ_DIST_START_SECONDS", "nan", f"MXQ_DIST_START_SECONDS=nan: {FINITE}"),
    "broker timeout inf":
        case("MXQ_BROKER_TIMEOUT_SECONDS", "inf",
             f"MXQ_BROKER_TIMEOUT_SECONDS=inf: {FINITE} (allowed: > 0 and <= 300)"),
    "batch wait 1e308":
        case("MXQ_BATCH_WAIT_MS", "1e308",
             "MXQ_BATCH_WAIT_MS=1e308: Input should be less than or equal to 60000"),
    # Counts: bounded, a 400-digit one named by its start
    "visibility 400 digits":
        case("MXQ_VISIBILITY_TIMEOUT", DIGITS_400,
             f"MXQ_VISIBILITY_TIMEOUT={'9' * 60}… (400 characters): "
             "Input should be less than or equal to 2592000"),
    "max attempts 1000":
        case("MXQ_MAX_ATTEMPTS", "1000",
             "MXQ_MAX_ATTEMPTS=1000: Input should be less than or equal to 100"),
    "max input bytes 400 digits":
        case("MXQ_MAX_INPUT_BYTES", DIGITS_400,
             "(400 characters): Input should be less than or equal to 1125899906842624"),
    "max batch size 1e9":
        case("MXQ_MAX_BATCH_SIZE", "1e9",
             "MXQ_MAX_BATCH_SIZE=1e9: Input should be a valid integer"),
    "max epochs 10**7":
        case("MXQ_MAX_EPOCHS", "10000000",
             "MXQ_MAX_EPOCHS=10000000: Input should be less than or equal to 1000000"),
    "max body 2**40":
        case("MXQ_MAX_BODY_BYTES", str(2**40),
             "MXQ_MAX_BODY_BYTES=1099511627776: Input should be less than or equal to 1073741824"),
    "small job samples 10**30":
        case("MXQ_SMALL_JOB_SAMPLES", str(10**30),
             f"MXQ_SMALL_JOB_SAMPLES={10**30}: Input should be less than or equal to 16777216"),
    "worker memory 10**20":
        case("MXQ_WORKER_MEMORY_MB", str(10**20),
             "MXQ_WORKER_MEMORY_MB=100000000000000000000: Input should be less than or equal to 16777216"),
    "probe budget inf":
        case("MXQ_MAX_PROBE_GFLOP", "inf",
             "MXQ_MAX_PROBE_GFLOP=inf: Input should be a valid integer"),
    "api port 99999":
        case("MXQ_API_PORT", "99999",
             "MXQ_API_PORT=99999: Input should be less than or equal to 65535"),
    # Devices bounded by the machine (was: 10,000 workers planned on 2 cores)
    "cpu devices 10000": case("MXQ_CPU_DEVICES", "10000", "MXQ_CPU_DEVICES=10000: at most "),
    "cpu devices past the override":
        case("MXQ_CPU_DEVICES", "9",
             "MXQ_CPU_DEVICES=9: at most 8 (MXQ_MAX_CPU_DEVICES)", MXQ_MAX_CPU_DEVICES="8"),
    "max cpu devices 5000":
        case("MXQ_MAX_CPU_DEVICES", "5000",
             "MXQ_MAX_CPU_DEVICES=5000: Input should be less than or equal to 1024"),
    "home that is a file":
        case("MXQ_HOME", "/etc/passwd", "MXQ_HOME=/etc/passwd: it is a file, not a folder"),
    # Refused at the API's start too (`mxq api`), before it serves anything
    "api start with a bad broker":
        case("MXQ_BROKER_URL", "ftp://x",
             "MXQ_BROKER_URL=ftp://x: scheme 'ftp'", args=("api",)),
    "api start with inf heartbeat":
        case("MXQ_HEARTBEAT_SECONDS", "inf",
             f"MXQ_HEARTBEAT_SECONDS=inf: {FINITE}", args=("api",)),
}


@pytest.mark.parametrize("name", list(SETTING_CASES), ids=lambda n: n.replace(" ", "-"))
def test_bad_setting_is_one_line(tmp_path: Path, name: str) -> None:
    bad = SETTING_CASES[name]
    home = tmp_path / "home"
    home.mkdir()
    result = run_cli(list(bad.args), {"MXQ_HOME": str(home), **bad.env})
    line = one_line(result.stderr)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert line.startswith("mxq: error: MXQ_"), line
    assert bad.needle in line, line
    assert "hunter2" not in line and ":pw@" not in line  # a URL's password is never repeated
    assert list(home.iterdir()) == []  # refused before anything started or was written
