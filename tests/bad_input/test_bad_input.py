"""One corpus of bad input, table-driven. Every job case goes through the CLI and the HTTP API in
this process (CliRunner, TestClient), every HTTP case through the API, every broker case straight
to a device queue: each gets a clear one-line error naming the value and what is allowed, no worker
dies, and nothing changes except that a job refused for its parameters is recorded as failed.
Once per kind of error, a case also makes the round trip through the real `mxq` program and the
real `mxq api` server."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from mxq.api import routes
from mxq.api.app import app
from tests.api_server import Api, counts, start_api
from tests.conftest import NODE, Stack, wait_until
from tests.support.bad_input import (
    API_MAX_INPUT_BYTES,
    AUTH,
    DEVICES,
    JSON,
    ON_WORKER,
    REFUSED,
    REJECTED,
    ROWS,
    TOKEN,
    JobCase,
    by_schema,
    case_id,
    check_job_case,
    expect_changes,
    infer,
    input_with,
    ok_input,
    probe,
    run_api_case,
    run_cli_case,
    save_input,
    schedule,
    still_standing,
    train,
)
from tests.support.bad_input import client as client  # a fixture: the API app in this process
from tests.support.bad_input import pids as pids  # a fixture: the workers at the start
from tests.support.images import png_bytes, solid
from tests.support.messages import one_line

# SQL and broker differ by backend (NUL, large numbers, how a refused job is stored): every case
# runs on both legs under `--legs both` (CI).
pytestmark = pytest.mark.both_legs


def _text(stack: Stack, name: str, body: str) -> str:
    (stack.home / "data" / name).write_text(body)
    return name


def _outside(stack: Stack) -> str:
    np.save(stack.home / "secret.npy", ROWS)
    return str(stack.home / "secret.npy")


def _symlink(stack: Stack) -> str:
    _outside(stack)
    link = stack.home / "data" / "escape.npy"
    if not link.is_symlink():
        link.symlink_to(stack.home / "secret.npy")
    return "escape.npy"


def _object_npy(stack: Stack) -> str:
    np.save(stack.home / "data" / "objects.npy", np.array([{"a": 1}, "x"] * 20, dtype=object),
            allow_pickle=True)
    return "objects.npy"


def _truncated(stack: Stack) -> str:
    path = stack.home / "data" / save_input(stack, "cut.npy", ROWS)
    path.write_bytes(path.read_bytes()[:-500])
    return "cut.npy"


def _tampered(stack: Stack) -> dict[str, Any]:
    """Model `fragile`, whose stored params file was replaced after registration (so it no
    longer matches its recorded checksum)."""
    known = {m["name"] for m in stack.mxq_json("models")}
    if "fragile" not in known:
        fragile = stack.mxq_json("models", "add", "fragile", "--arch", "mlp", "--input-shape", "64")
        other = stack.mxq_json("models", "add", "fragile-other", "--arch", "mlp", "--input-shape", "64",
                               "--classes", "3")
        shutil.copyfile(other["params_file"], fragile["params_file"])
    return {"model": "fragile", "input": ok_input(stack), "device": "cpu:0"}


def _npy_claiming(stack: Stack, name: str, shape: tuple[int, ...], descr: str = "<f4") -> str:
    """An .npy whose header claims `shape` of `descr` over a few bytes of data."""
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}".encode()
    header += b" " * (63 - len(header) % 64) + b"\n"
    (stack.home / "data" / name).write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header))
                                             + header + b"\x00" * 64)
    return name


def _npz_claiming(stack: Stack) -> str:
    """An .npz of 1 KB whose array claims (10**12, 64) float32: 256 TB when read."""
    _npy_claiming(stack, "claims.npy", (10**12, 64))
    with zipfile.ZipFile(stack.home / "data" / "bomb.npz", "w", zipfile.ZIP_DEFLATED) as zf:
        zf.write(stack.home / "data" / "claims.npy", "X.npy")
    return "bomb.npz"


def _many_arrays(stack: Stack) -> str:
    np.savez(stack.home / "data" / "many.npz", **{f"a{i}": np.zeros(1, np.float32) for i in range(2000)})
    return "many.npz"


def _fifo(stack: Stack, name: str = "fifo.npy") -> str:
    path = stack.home / "data" / name
    if not path.exists():
        os.mkfifo(path)
    return name


def _images_with(stack: Stack, folder: str, name: str, body: bytes | None) -> str:
    """A folder of two good 8x8 images and `name`: `body`, or a FIFO when None."""
    path = stack.home / "data" / folder
    path.mkdir(exist_ok=True)
    for i in range(2):
        (path / f"good{i}.png").write_bytes(png_bytes(solid((10, 20, 30), 8, 8)[:, :, 0]))
    if body is None:
        _fifo(stack, f"{folder}/{name}")
    else:
        (path / name).write_bytes(body)
    return folder


def _image_escape(stack: Stack) -> str:
    (stack.home / "outside.png").write_bytes(png_bytes(solid((1, 2, 3), 8, 8)[:, :, 0]))
    folder = _images_with(stack, "escape-imgs", "good9.png", png_bytes(solid((4, 5, 6), 8, 8)[:, :, 0]))
    link = stack.home / "data" / folder / "linked.png"
    if not link.is_symlink():
        link.symlink_to(stack.home / "outside.png")
    return folder


def _jpeg(cut: int | None = None) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.full((8, 8), 128, np.uint8)).save(out, format="JPEG")
    return out.getvalue()[:cut]


def _huge_png_header() -> bytes:
    """A PNG whose header says 30000x30000 (900 million pixels) in 57 bytes."""
    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))
    ihdr = struct.pack(">IIBBBBB", 30000, 30000, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def _bad_index(stack: Stack) -> str:
    (stack.home / "data" / "bad.rec").write_bytes(b"\x00" * 64)
    (stack.home / "data" / "bad.idx").write_text("0\t0\nnot an index line\n")
    return "bad.rec"


def _image_model(stack: Stack) -> str:
    """`cnn8`: a LeNet for 1x8x8 images, registered once."""
    if "cnn8" not in {m["name"] for m in stack.mxq_json("models")}:
        assert stack.mxq("models", "add", "cnn8", "--arch", "lenet", "--input-shape", "1,8,8").returncode == 0
    return "cnn8"


def image_case(input: Callable[[Stack], str], needle: str, ends: str = ON_WORKER) -> JobCase:
    return JobCase("infer", lambda s: {"model": _image_model(s), "input": input(s), "device": "cpu:0"},
                   needle, ends)


OUTSIDE = "lies outside the data root"
BIG = 8000  # rows of 64 float32: about 2 MB, over the 1 MB this corpus allows
BIG_ROWS = np.zeros((BIG, 64), np.float32)
ALLOWED_DTYPES = "allowed: bool, int, uint or float"
# Job cases by kind of error; the first case of each kind also makes the real round trips.
JOB_CASE_KINDS: dict[str, dict[str, JobCase]] = {
    "paths": {
        "path with ..": infer(lambda s: (_outside(s), "../secret.npy")[1], OUTSIDE),
        "absolute path outside the data root": infer(_outside, OUTSIDE),
        "symlink escaping the data root": infer(_symlink, OUTSIDE),
        "missing file": infer(lambda s: "missing.npy", "input missing.npy does not exist"),
        "NUL in the path": JobCase("infer", lambda s: {"model": "mlp64", "input": "ok\x00.npy"},
                                   "input='ok\\x00.npy': NUL characters are not allowed", REJECTED,
                                   channels=("api",)),  # (no process argument can hold a NUL)
        "input over MXQ_MAX_INPUT_BYTES": JobCase(
            "infer", lambda s: {"model": "mlp64", "input": save_input(s, "big.npy", BIG_ROWS)},
            f"input big.npy holds {BIG * 64 * 4 + 128} bytes, more than the {API_MAX_INPUT_BYTES} bytes "
            "allowed (MXQ_MAX_INPUT_BYTES)", REJECTED,
            cli_env={"MXQ_MAX_INPUT_BYTES": str(API_MAX_INPUT_BYTES)}),
    },
    "data": {
        "wrong feature count": infer(lambda s: save_input(s, "narrow.npy", ROWS[:, :32]),
                                     "has samples of shape (32,) but model expects (64,)", ON_WORKER),
        "strings in a csv": infer(lambda s: _text(s, "words.csv", "1,2,3\n4,five,6\n"),
                                  "line 2 has a non-numeric value", ON_WORKER),
        "npy of dtype object": infer(_object_npy, f"has dtype object; {ALLOWED_DTYPES}", ON_WORKER),
        "npy of dtype complex": infer(lambda s: save_input(s, "complex.npy", ROWS.astype(np.complex64)),
                                      f"has dtype complex64; {ALLOWED_DTYPES}", ON_WORKER),
        "npy of strings": infer(lambda s: save_input(s, "strings.npy", np.array([["a"] * 64] * 4)),
                                f"has dtype <U1; {ALLOWED_DTYPES}", ON_WORKER),
        "truncated npy": infer(_truncated, "cut.npy is truncated or corrupt: 2435 of 2560 values present",
                               ON_WORKER),
        "empty npy": infer(lambda s: save_input(s, "empty.npy", np.zeros((0, 64), np.float32)),
                           "holds no samples", ON_WORKER),
        "NaN with --reject-nan": infer(input_with(float("nan")), "has NaN in sample 5 (--reject-nan is set)",
                                       ON_WORKER, reject_nan=True),
        "inf with --reject-nan": infer(input_with(float("inf")), "has inf in sample 5 (--reject-nan is set)",
                                       ON_WORKER, reject_nan=True),
        "-inf with --reject-nan": infer(input_with(float("-inf")),
                                        "has -inf in sample 5 (--reject-nan is set)", ON_WORKER,
                                        reject_nan=True),
    },
    "decoded size": {  # what a file holds once read, not its bytes on disk
        "npz whose array claims 256 TB": infer(_npz_claiming, "array 'X' holds 256,000,000,000,000 bytes "
                                               "of float32 (1000000000000, 64) when read, more than the",
                                               ON_WORKER),
        "npy whose header claims 10**23 samples": infer(
            lambda s: _npy_claiming(s, "huge.npy", (10**23, 64)),
            "holds 25,600,000,000,000,000,000,000,000 bytes of float32", ON_WORKER),
        "image of 30000x30000 pixels in 57 bytes": image_case(
            lambda s: _images_with(s, "huge-imgs", "huge.png", _huge_png_header()),
            "is 30000x30000 pixels (900,000,000), more than the 50,000,000 allowed (MXQ_MAX_IMAGE_PIXELS)"),
    },
    "broken files": {  # each fails its job naming the file and what it found
        "PNG cut to 40 bytes": image_case(
            lambda s: _images_with(s, "cut-imgs", "cut.png", png_bytes(solid((9, 9, 9), 8, 8)[:, :, 0])[:40]),
            "cut.png is not a whole PNG or JPEG image: it is a PNG cut short"),
        "empty PNG": image_case(lambda s: _images_with(s, "empty-imgs", "empty.png", b""),
                                "empty.png is not a whole PNG or JPEG image: it is an empty file (0 bytes)"),
        "text saved as a PNG": image_case(
            lambda s: _images_with(s, "text-imgs", "text.png", b"hello"),
            "text.png is not a whole PNG or JPEG image: it is neither PNG nor JPEG"),
        "JPEG cut short": image_case(lambda s: _images_with(s, "cutjpg-imgs", "cut.jpg", _jpeg(cut=-40)),
                                     "cut.jpg is not a whole PNG or JPEG image: it is a JPEG cut short"),
        "npy of dtype <f3": infer(lambda s: _npy_claiming(s, "f3.npy", (4, 64), "<f3"),
                                  "its header names the dtype '<f3', which is not a NumPy dtype", ON_WORKER),
        "npz of 2,000 arrays, none named X": infer(_many_arrays, "a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, … "
                                                   "(2000 arrays)) and none is named X", ON_WORKER),
        "float64 beyond float32's range": infer(
            lambda s: save_input(s, "f64.npy", np.where(np.arange(40 * 64).reshape(40, 64) == 5 * 64 + 3,
                                                        1e300, ROWS.astype(np.float64))),
            "has 1e+300 in sample 5, beyond float32's range", ON_WORKER),
        "RecordIO with a bad index": image_case(_bad_index, "has an index bad.idx whose line 2 is not "
                                                "'key<TAB>offset': 'not an index line'"),
    },
    "not regular files": {  # a FIFO blocks whoever opens it until a writer comes
        "FIFO as input": infer(_fifo, "input fifo.npy is not a regular file or folder (a FIFO, socket or "
                               "device?)"),
        "FIFO inside an image folder": image_case(
            lambda s: _images_with(s, "fifo-imgs", "pipe.png", None),
            "pipe.png is not a regular file (a FIFO, socket or device?)"),
        "image symlinked from outside the data root": image_case(
            _image_escape, "linked.png leads outside its folder"),
    },
    "numbers": {  # the API's schema refuses these; the CLI records them as failed jobs
        "batch size 0": by_schema(infer(
            needle="batch_size=0: Input should be greater than or equal to 1", batch_size=0)),
        "batch size negative": by_schema(infer(
            needle="batch_size=-5: Input should be greater than or equal to 1", batch_size=-5)),
        "batch size over the max": by_schema(infer(
            needle="batch_size=65537: Input should be less than or equal to 65536 (MXQ_MAX_BATCH_SIZE)",
            batch_size=65537)),
        "top-k over the max": by_schema(infer(
            needle="top_k=101: Input should be less than or equal to 100", top_k=101)),
        "top-k over the classes": infer(needle="top-k 11 exceeds the 10 classes of mlp64:1", ends=ON_WORKER,
                                        top_k=11),
        "unknown output": by_schema(infer(
            needle="output='xml': Input should be 'db', 'npy', 'both' or 'parquet'", output="xml")),
        "train batch size over the max": by_schema(train(
            "batch_size=100000: Input should be less than or equal to 65536 (MXQ_MAX_BATCH_SIZE)",
            batch_size=100000)),
        "epochs 0": by_schema(train("epochs=0: Input should be greater than or equal to 1", epochs=0)),
        "epochs over the max": by_schema(train(
            "epochs=10001: Input should be less than or equal to 10000 (MXQ_MAX_EPOCHS)", epochs=10001)),
        "learning rate negative": by_schema(train("lr=-0.5: Input should be greater than 0", lr=-0.5)),
        "learning rate NaN": by_schema(train("lr=nan: Input should be a finite number", lr=float("nan"))),
        "unknown architecture": train(  # a name: a built-in or registered one, checked at submit
            "unknown architecture 'vgg99'; known: mlp, lenet, resnet18_v1", arch="vgg99"),
        "model name with a slash": by_schema(train("name='../../etc': String should match pattern",
                                                   name="../../etc")),
        "probe size too small": by_schema(probe("size=1: Input should be greater than or equal to 16",
                                                REJECTED, size=1)),
        # refused alike, nothing recorded: by the API's schema, by the CLI's option (issue 58)
        "time limit over its bound": replace(probe("Input should be less than or equal to 999999999",
                                                   time_limit=1_000_000_000), channels=("api",)),
        "time limit amount of 5 digits": replace(probe(
            "time_limit='10000d': expected a duration of at least 1s", time_limit="10000d"),
            channels=("api",)),
        "time limit amount of 5 digits, CLI": replace(probe(
            "--time-limit '10000d': expected a duration of at least 1s", time_limit="10000d"),
            channels=("cli",)),
        "time limit not a duration": probe("'5x': expected a duration of at least 1s, such as 90s",
                                           time_limit="5x"),
        "inference time limit with a fraction": infer(
            needle="'1.5h': expected a duration of at least 1s, such as 90s, 45m, 2h or 1h30m", ends=REFUSED,
            time_limit="1.5h"),
        "training time limit out of order": JobCase(
            "train", lambda s: {"arch": "mlp", "dataset": "digits", "name": "faulty",
                                "time_limit": "30m2h"},
            "'30m2h': expected a duration of at least 1s, such as 90s, 45m, 2h or 1h30m", REFUSED),
        "an internal field": by_schema(JobCase(
            "train", lambda s: {"arch": "mlp", "dataset": "digits", "name": "faulty", "fire_id": 1},
            "fire_id=1: Extra inputs are not permitted", REJECTED, channels=("api",))),
    },
    "schedules": {
        "malformed cron": schedule("invalid cron expression '61 * * * *': expected five fields",
                                   cron="61 * * * *"),
        "cron with six fields": schedule("invalid cron expression '0 0 3 * * *': expected five fields",
                                         cron="0 0 3 * * *"),
        "cron in words": schedule("invalid cron expression 'every day'", cron="every day"),
        "unknown time zone": schedule("unknown time zone 'Mars/Olympus_Mons': use an IANA name",
                                      tz="Mars/Olympus_Mons"),
        "dataset outside the data root": schedule("dataset source /etc lies outside the data root",
                                                  dataset="/etc/*"),
        "recursive glob outside the data root": schedule("dataset source /usr lies outside the data root",
                                                         dataset="/usr/**/*.py"),
        "dataset climbing out with ..": schedule("dataset source ../.. lies outside the data root",
                                                 dataset="../../*.npz"),
        "schedule epochs over the max": schedule("epochs=20000: Input should be less than or equal to 10000",
                                                 epochs=20000),
        "schedule time limit 0": replace(schedule(
            "time_limit='0': expected a duration of at least 1s", time_limit="0"), channels=("api",)),
        "schedule time limit 0, CLI": replace(schedule(
            "--time-limit '0': expected a duration of at least 1s", time_limit="0"), channels=("cli",)),
        "schedule time limit not a duration": schedule("'2 hours': expected a duration of at least 1s",
                                                       time_limit="2 hours"),
    },
    "models": {
        "unknown model name": JobCase("infer", lambda s: {"model": "nosuch", "input": ok_input(s)},
                                      "unknown model 'nosuch'; known models:", REJECTED),
        "unknown model version": JobCase("infer", lambda s: {"model": "mlp64:9", "input": ok_input(s)},
                                         "model 'mlp64' has no version 9; versions: 1", REJECTED),
        "model version not a number": JobCase("infer",
                                              lambda s: {"model": "mlp64:latest", "input": ok_input(s)},
                                              "model version 'latest' in 'mlp64:latest' must be a number",
                                              REJECTED),
        "params that no longer match their checksum": JobCase("infer", _tampered,
                                                              "does not match its recorded checksum",
                                                              ON_WORKER),
    },
    "names": {  # a model's name becomes a folder of the model store (mxq.names)
        "training named ..": by_schema(train("name='..': String should match pattern", name="..")),
        "training named by an absolute path": by_schema(train("name='/tmp/x': String should match pattern",
                                                              name="/tmp/x")),
        "training named like a flag": by_schema(train("name='-rf': String should match pattern", name="-rf")),
        "training named with 10,000 characters": by_schema(train("String should match pattern",
                                                                 name="a" * 10_000)),
    },
    "devices": {
        "unknown device": probe("device cpu:7 is not known on node testnode; known devices: cpu:0, cpu:1",
                                device="cpu:7"),
        "malformed device": probe("invalid device 'tpu:0': expected auto, auto:gpu, auto:cpu, gpu:N or cpu:N",
                                  device="tpu:0"),
        "device with a dash": probe("invalid device 'gpu-1'", device="gpu-1"),
        "no live gpu for auto:gpu": probe("no live gpu worker to run an auto job", device="auto:gpu"),
    },
}
JOB_CASES: dict[str, JobCase] = {name: c for cases in JOB_CASE_KINDS.values() for name, c in cases.items()}
JOB_ROUND_TRIPS = [next(iter(cases)) for cases in JOB_CASE_KINDS.values()]


@pytest.fixture(scope="module")
def server(workers: Stack) -> Iterator[Api]:
    """The real `mxq api` process, for the round trips."""
    yield from start_api(workers, TOKEN, "api-bad-input", MXQ_MAX_INPUT_BYTES=str(API_MAX_INPUT_BYTES))


@pytest.mark.parametrize("channel,case", [pytest.param(ch, name, id=f"{ch}-{case_id(name)}")
                                          for name, c in JOB_CASES.items() for ch in c.channels])
def test_bad_job_request(workers: Stack, client: TestClient, pids: dict[str, int], channel: str,
                         case: str) -> None:
    c = JOB_CASES[case]
    if channel == "cli":
        check_job_case(workers, pids, c, lambda p: run_cli_case(workers.mxq, workers, c, p))
    else:
        c = c.through_api()
        check_job_case(workers, pids, c, lambda p: run_api_case(client, workers, c, p))


@pytest.mark.parametrize("case", JOB_ROUND_TRIPS, ids=case_id)
def test_bad_job_request_through_the_real_program_and_server(workers: Stack, server: Api,
                                                             pids: dict[str, int], case: str) -> None:
    c = JOB_CASES[case]
    check_job_case(workers, pids, c, lambda p: run_cli_case(workers.mxq_process, workers, c, p))
    with server.client() as real:
        api = c.through_api()
        check_job_case(workers, pids, api, lambda p: run_api_case(real, workers, api, p))
    assert server.proc.poll() is None


# Requests the HTTP layer refuses, by kind of error: (method, path, request options, status,
# what the detail says). The first case of each kind also goes to the real server.
BIG_BODY = json.dumps({"kind": "probe", "pad": "x" * (2 << 20)})
NEEDS_TOKEN = "Authorization: Bearer <token>"
READ = {"headers": AUTH}  # reads need the token too
HttpCase = tuple[str, str, dict[str, Any], int, str]
HTTP_CASE_KINDS: dict[str, dict[str, HttpCase]] = {
    "token": {
        "wrong token": ("POST", "/api/v1/jobs", {"json": {"kind": "probe"},
                                                  "headers": {"Authorization": "Bearer nope"}},
                        401, NEEDS_TOKEN),
        "token without Bearer": ("POST", "/api/v1/jobs", {"json": {"kind": "probe"},
                                                           "headers": {"Authorization": TOKEN}},
                                 401, NEEDS_TOKEN),
        "missing token on a write": ("POST", "/api/v1/jobs", {"json": {"kind": "probe"}}, 401, NEEDS_TOKEN),
        "missing token on a cancel": ("POST", "/api/v1/jobs/1/cancel", {}, 401, NEEDS_TOKEN),
        "missing token on a delete": ("DELETE", "/api/v1/schedules/x", {}, 401, NEEDS_TOKEN),
        "missing token on a read": ("GET", "/api/v1/jobs", {}, 401, NEEDS_TOKEN),
        "missing token on predictions": ("GET", "/api/v1/jobs/1/predictions", {}, 401, NEEDS_TOKEN),
    },
    "body": {
        "oversized body": ("POST", "/api/v1/jobs", {"content": BIG_BODY, "headers": {**AUTH, **JSON}}, 413,
                           f"request body of {len(BIG_BODY)} bytes exceeds the limit of 1048576 bytes "
                           "(MXQ_MAX_BODY_BYTES)"),
        "oversized streamed body": ("POST", "/api/v1/jobs", {
            "content": lambda: (BIG_BODY[i:i + 65536].encode() for i in range(0, len(BIG_BODY), 65536)),
            "headers": {**AUTH, **JSON}}, 413,
            "request body exceeds the limit of 1048576 bytes (MXQ_MAX_BODY_BYTES)"),
        "malformed JSON": ("POST", "/api/v1/jobs", {"content": b'{"kind": "probe",',
                                                     "headers": {**AUTH, **JSON}},
                           422, "malformed JSON body at character 17"),
        "body that is not UTF-8": ("POST", "/api/v1/jobs", {"content": b'{"kind": "\xff"}',
                                                           "headers": {**AUTH, **JSON}},
                                   422, "malformed JSON body: it is not UTF-8 text"),
        "JSON list instead of object": ("POST", "/api/v1/jobs", {"json": ["probe"], "headers": AUTH}, 422,
                                        "Input should be a valid dictionary"),
        "unknown job kind": ("POST", "/api/v1/jobs", {"json": {"kind": "dance"}, "headers": AUTH}, 422,
                             "Input tag 'dance' found using 'kind' does not match any of the expected tags: "
                             "'probe', 'infer', 'train'"),
        "promote version 0": ("POST", "/api/v1/models/mlp64/promote",
                              {"json": {"version": 0}, "headers": AUTH},
                              422, "version=0: Input should be greater than or equal to 1"),
    },
    "query": {
        "page limit 0": ("GET", "/api/v1/jobs?limit=0", READ, 422,
                         "limit='0': Input should be greater than or equal to 1"),
        "NUL in a filter": ("GET", "/api/v1/jobs?user=a%00b&kind=x", READ, 422,
                            "user='a\\x00b': String should match pattern"),  # a 500 on PostgreSQL
        "unknown status filter": ("GET", "/api/v1/jobs?status=bogus", READ, 422,
                                  "status='bogus': Input should be 'queued', 'running', 'succeeded', "
                                  "'failed' or 'cancelled'"),
    },
    "edge values": {  # numbers past what a column holds, or past any date
        "job id of 2**63": ("GET", f"/api/v1/jobs/{2**63}", READ, 422,
                            f"job_id='{2**63}': Input should be less than or equal to 2147483647"),
        "cancel id of 10**23": ("POST", f"/api/v1/jobs/{10**23}/cancel", {"headers": AUTH}, 422,
                                "Input should be less than or equal to 2147483647"),
        "offset of 2**63": ("GET", f"/api/v1/jobs?offset={2**63}", READ, 422,
                            f"offset='{2**63}': Input should be less than or equal to 2147483647"),
        "predictions offset of 2**63": ("GET", f"/api/v1/jobs/1/predictions?offset={2**63}", READ, 422,
                                        "Input should be less than or equal to 2147483647"),
        "promote version 2**63": ("POST", "/api/v1/models/mlp64/promote",
                                  {"json": {"version": 2**63}, "headers": AUTH}, 422,
                                  "Input should be less than or equal to 2147483647"),
        "model version 2**63": ("POST", "/api/v1/jobs", {"json": {"kind": "infer", "model": "mlp64",
                                                                  "input": "ok.npy", "model_version": 2**63},
                                                         "headers": AUTH}, 422,
                                "Input should be less than or equal to 2147483647"),
        "batch size 1e400": ("POST", "/api/v1/jobs", {"content": b'{"kind": "infer", "model": "mlp64", '
                                                                 b'"input": "ok.npy", "batch_size": 1e400}',
                                                      "headers": {**AUTH, **JSON}}, 422,
                             "infer.batch_size.constrained-int=inf: Input should be a valid integer"),
        "since 99999999999h": ("GET", "/api/v1/jobs?since=99999999999h", READ, 422,
                               "since '99999999999h': use an age such as 30m"),
        "since 999999999d": ("GET", "/api/v1/jobs?since=999999999d", READ, 422,
                             "since '999999999d' reaches before the year 1"),
        "cron that never comes": ("POST", "/api/v1/schedules", {
            "json": {"name": "never", "cron": "0 0 30 2 *", "dataset": "d.npz", "model": "never",
                     "arch": "mlp"}, "headers": AUTH}, 422,
            "cron expression '0 0 30 2 *' names no date that ever comes (such as February 30)"),
        "cron wider than its column": ("POST", "/api/v1/schedules", {
            "json": {"name": "wide", "cron": ",".join(map(str, range(60))) + " * * * *",
                     "dataset": "d.npz", "model": "wide", "arch": "mlp"}, "headers": AUTH}, 422,
            "String should have at most 128 characters"),
        "a field of half a megabyte": ("POST", "/api/v1/jobs", {
            "json": {"kind": "probe", "size": "9" * 500_000}, "headers": AUTH}, 422,
            "… (500002 characters): Input should be a valid integer"),  # not echoed whole
        "a boolean given as 0": ("POST", "/api/v1/jobs", {"json": {"kind": "probe", "allow_offline": 0},
                                                         "headers": AUTH}, 422,
                                 "probe.allow_offline=0: Input should be a valid boolean"),
        "a number given as text": ("POST", "/api/v1/jobs", {"json": {"kind": "probe", "size": "64"},
                                                           "headers": AUTH}, 422,
                                   "probe.size='64': Input should be a valid integer"),
    },
    "method": {
        "a method the path lacks": ("PUT", "/api/v1/schedules/x", {"headers": AUTH}, 405,
                                    "Method Not Allowed"),
    },
    "not found": {
        "unknown job": ("GET", "/api/v1/jobs/987654", READ, 404, "no job 987654"),
        "predictions of an unknown job": ("GET", "/api/v1/jobs/987654/predictions", READ, 404,
                                          "no job 987654"),
        "cancel an unknown job": ("POST", "/api/v1/jobs/987654/cancel", {"headers": AUTH}, 404,
                                  "no job 987654"),
        "unknown model": ("GET", "/api/v1/models/nope", READ, 404, "unknown model 'nope'"),
        "unknown schedule": ("GET", "/api/v1/schedules/nope", READ, 404, "nope"),
    },
}
# Without a token the API serves loopback only, and a browser is the adversary: a page of another
# origin posting a form, or a DNS name of the attacker's rebound to 127.0.0.1.
EVIL = "http://attacker.example"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
NO_TOKEN_CASES: dict[str, HttpCase] = {
    "form post from another origin cancels": ("POST", "/api/v1/jobs/1/cancel", {
        "content": b"x=1", "headers": {"Origin": EVIL, **FORM}}, 403,
        "a write from the page origin 'http://attacker.example' is refused"),
    "text/plain form fires a schedule": ("POST", "/api/v1/schedules/nightly/run-now", {
        "content": b"x", "headers": {"Origin": EVIL, "Content-Type": "text/plain"}}, 403,
        "without MXQ_API_TOKEN only this API's own pages and programs may write"),
    "script on another port of this host": ("DELETE", "/api/v1/schedules/nightly", {
        "headers": {"Origin": "http://127.0.0.1:3000"}}, 403, "'http://127.0.0.1:3000' is refused"),
    "sandboxed page (Origin null)": ("POST", "/api/v1/jobs", {
        "json": {"kind": "probe"}, "headers": {"Origin": "null"}}, 403, "'null' is refused"),
    "text/plain job without an Origin": ("POST", "/api/v1/jobs", {
        "content": b'{"kind": "probe"}', "headers": {"Content-Type": "text/plain"}}, 415,
        "Content-Type 'text/plain' is refused: a request body must be application/json"),
    "application/evil+json": ("POST", "/api/v1/jobs", {
        "content": b'{"kind": "probe"}', "headers": {"Content-Type": "application/evil+json"}}, 415,
        "Content-Type 'application/evil+json' is refused"),
    "multipart form": ("POST", "/api/v1/jobs", {
        "files": {"kind": ("k", b"probe")}}, 415, "Content-Type 'multipart/form-data' is refused"),
    "rebound DNS name reads": ("GET", "/api/v1/jobs", {"headers": {"Host": "attacker.example"}}, 421,
                               "Host 'attacker.example' is not a name this API serves"),
    "rebound DNS name writes": ("POST", "/api/v1/jobs", {
        "json": {"kind": "probe"}, "headers": {"Host": "attacker.example:8470"}}, 421,
        "Host 'attacker.example' is not a name this API serves"),
    "no Host at all": ("GET", "/api/v1/devices", {"headers": {"Host": ""}}, 421,
                       "Host '(none)' is not a name this API serves"),
}
HTTP_CASE_KINDS["no token"] = NO_TOKEN_CASES
HTTP_CASES: dict[str, HttpCase] = {name: c for cases in HTTP_CASE_KINDS.values() for name, c in cases.items()}
HTTP_ROUND_TRIPS = [next(iter(cases)) for kind, cases in HTTP_CASE_KINDS.items() if kind != "no token"]


def _check_http_case(stack: Stack, pids: dict[str, int], client: httpx.Client, case: str) -> None:
    method, path, options, status, needle = HTTP_CASES[case]
    if callable(options.get("content")):  # a fresh generator for each request
        options = {**options, "content": options["content"]()}
    before = counts(stack)
    r = client.request(method, path, **options)
    assert r.status_code == status, (r.status_code, r.text)
    detail = r.json()["detail"]
    assert isinstance(detail, str) and needle in detail, detail
    expect_changes(before, counts(stack), 0)
    still_standing(stack, pids)


@pytest.fixture
def open_client(workers: Stack, client: TestClient) -> Iterator[TestClient]:
    """The API app with no token set, as on loopback by default, for one test: then the
    corpus's token again (`client`'s settings: both drive the one app)."""
    s = workers.settings.model_copy(update={"api_token": None})
    corpus = app.dependency_overrides[routes.settings]
    app.dependency_overrides[routes.settings] = lambda: s
    try:
        with TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000)) as test_client:
            yield test_client
    finally:
        app.dependency_overrides[routes.settings] = corpus


@pytest.mark.parametrize("case", [c for c in HTTP_CASES if c not in NO_TOKEN_CASES], ids=case_id)
def test_bad_http_request(workers: Stack, client: TestClient, pids: dict[str, int], case: str) -> None:
    _check_http_case(workers, pids, client, case)


@pytest.mark.parametrize("case", list(NO_TOKEN_CASES), ids=case_id)
def test_bad_http_request_without_a_token(workers: Stack, open_client: TestClient, pids: dict[str, int],
                                          case: str) -> None:
    _check_http_case(workers, pids, open_client, case)
    allowed = open_client.post("/api/v1/jobs/987654/cancel", headers={"Origin": "http://127.0.0.1"})
    assert allowed.status_code == 404  # the same origin passes (and finds no such job)


@pytest.mark.parametrize("case", ["form post from another origin cancels", "rebound DNS name reads"],
                         ids=case_id)
def test_bad_http_request_without_a_token_to_the_real_server(workers: Stack, pids: dict[str, int],
                                                             case: str) -> None:
    for server in start_api(workers, None, "api-no-token"):
        with server.client(token=False) as real:
            _check_http_case(workers, pids, real, case)
        assert server.proc.poll() is None


@pytest.mark.parametrize("case", HTTP_ROUND_TRIPS, ids=case_id)
def test_bad_http_request_to_the_real_server(workers: Stack, server: Api, pids: dict[str, int],
                                             case: str) -> None:
    with server.client(token=False) as real:
        _check_http_case(workers, pids, real, case)
    assert server.proc.poll() is None


def _glob_tree(stack: Stack) -> None:
    """Below the data root: a symlink loop, a symlink to a file outside the root, 60 folders."""
    tree = stack.home / "data" / "globs"
    if tree.exists():
        return
    (tree / "loop").mkdir(parents=True)
    (tree / "loop" / "again").symlink_to(tree / "loop")  # loop/again/again/... for ever
    np.save(stack.home / "secret-train.npy", ROWS)
    (tree / "leak").mkdir()
    (tree / "leak" / "secret.npz").symlink_to(stack.home / "secret-train.npy")
    for i in range(60):
        (tree / "wide" / f"d{i}").mkdir(parents=True)


# `mxq schedule run-now` walking a dataset glob inside the root: (source, its environment, the
# error of the fire). The walk never enters a symlinked folder, never offers a file outside the
# root (nor names it), and stops at its bounds.
GLOB_CASES: dict[str, tuple[str, dict[str, str], str]] = {
    "glob through a symlink loop": ("globs/loop/**/*.npz", {}, "matches no file"),
    "glob matching only a file outside the root": ("globs/leak/*.npz", {}, "matches no file"),
    "glob past MXQ_GLOB_MAX_ENTRIES": ("globs/wide/**/*.npz", {"MXQ_GLOB_MAX_ENTRIES": "50"},
                                       "looked at more than 50 entries without finishing "
                                       "(MXQ_GLOB_MAX_ENTRIES)"),
    "glob past MXQ_GLOB_SECONDS": ("globs/wide/**/*.npz", {"MXQ_GLOB_SECONDS": "0.000001"},
                                   "to search (MXQ_GLOB_SECONDS): narrow the pattern"),
}


@pytest.mark.parametrize("case", list(GLOB_CASES), ids=case_id)
def test_schedule_globs_are_bounded_and_confined(workers: Stack, pids: dict[str, int], case: str) -> None:
    source, env, needle = GLOB_CASES[case]
    _glob_tree(workers)
    name = f"glob-{case_id(case)}"
    add = workers.mxq("schedule", "add", name, "--cron", "0 3 * * *", "--arch", "mlp", "--dataset", source,
                      "--model", "globbed", env=env)
    assert add.returncode == 0, add.stderr
    try:
        proc = workers.mxq("schedule", "run-now", name, env=env)  # (a loop once spun for minutes)
        line = one_line(proc.stderr)
        assert proc.returncode == 1 and needle in line and "secret" not in line, line
    finally:
        workers.mxq("schedule", "rm", name)
    still_standing(workers, pids)


# The CLI at the same edges: (arguments, what the one error says). Exit 2, no traceback.
CLI_EDGES: dict[str, tuple[list[str], str]] = {
    "job id of 2**63": (["job", str(2**63)], "Input should be less than or equal to 2147483647"),
    "results of job 10**23": (["results", str(10**23)], "Input should be less than or equal to 2147483647"),
    "cancel job 2**63": (["cancel", str(2**63)], "Input should be less than or equal to 2147483647"),
    "results offset 2**63": (["results", "1", "--offset", str(2**63)], "less than or equal to"),
    "promote version 2**63": (["models", "promote", "mlp64", str(2**63)], "less than or equal to"),
    "since 99999999999h": (["jobs", "--since", "99999999999h"], "use an age such as 30m"),
    "since 999999999d": (["jobs", "--since", "999999999d"], "reaches before the year 1"),
    "cron that never comes": (["schedule", "add", "never", "--cron", "0 0 30 2 *", "--arch", "mlp",
                               "--dataset", "d.npz", "--model", "never"], "names no date that ever comes"),
}


@pytest.mark.parametrize("case", list(CLI_EDGES), ids=case_id)
def test_cli_edge_values(workers: Stack, pids: dict[str, int], case: str) -> None:
    args, needle = CLI_EDGES[case]
    before = counts(workers)
    proc = workers.mxq(*args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert needle in " ".join(proc.stderr.replace("│", " ").split()), proc.stderr
    expect_changes(before, counts(workers), 0)
    still_standing(workers, pids)


BAD_NAMES = {"..": "'..'", "../../../x": "'../../../x'", "/tmp/absolute": "'/tmp/absolute'",
             "": "''", "-rf": "'-rf'", ".hidden": "'.hidden'", "a/b": "'a/b'",
             "x" * 10_000: f"'{'x' * 80}…' (10000 characters)"}


@pytest.mark.parametrize("name", list(BAD_NAMES), ids=lambda n: case_id(n[:20]) or "empty")
def test_bad_model_name_is_refused_before_anything_is_written(workers: Stack, pids: dict[str, int],
                                                              name: str) -> None:
    """`mxq models add` once wrote outside the model store for `../../../x`, `/abs`, `..`."""
    before, files = counts(workers), sorted(p for p in workers.home.rglob("*") if "logs" not in p.parts)
    proc = workers.mxq("models", "add", "--arch", "mlp", "--input-shape", "4", "--", name)
    line = one_line(proc.stderr)
    assert proc.returncode == 2 and f"model name {BAD_NAMES[name]}" in line and "is not allowed" in line, line
    assert len(line) < 400  # a 10,000-character name is shortened, not echoed whole
    expect_changes(before, counts(workers), 0)
    assert sorted(p for p in workers.home.rglob("*") if "logs" not in p.parts) == files
    still_standing(workers, pids)


# `mxq models add NAME --symbol S --params P` with files that are not what they claim: (how to make
# the symbol and params from a good pair, what the one error says).
ModelFiles = Callable[[Path, Path, Path], tuple[Path, Path]]


def _write(tmp: Path, name: str, body: bytes) -> Path:
    (tmp / name).write_bytes(body)
    return tmp / name


MODEL_FILE_CASES: dict[str, tuple[ModelFiles, str]] = {
    "random bytes as params": (
        lambda sym, par, tmp: (sym, _write(tmp, "random.params", np.random.default_rng(1).bytes(5000))),
        "params file random.params is not an MXNet params file: it does not start with MXNet's"),
    "params claiming 2**63 arrays": (
        lambda sym, par, tmp: (sym, _write(tmp, "bomb.params", struct.pack("<QQQ", 0x112, 0, 2**63 - 1))),
        "params file bomb.params claims 9223372036854775807 arrays in 24 bytes: it is cut short or corrupt"),
    "params cut short": (lambda sym, par, tmp: (sym, _write(tmp, "cut.params", par.read_bytes()[:300])),
                         "params file cut.params does not match symbol"),
    "symbol that is not JSON": (lambda sym, par, tmp: (_write(tmp, "s.json", b"\x9b\x00binary"), par),
                                "symbol file s.json is not JSON"),
    "symbol JSON of something else": (lambda sym, par, tmp: (_write(tmp, "s.json", b'{"nodes": []}'), par),
                                      "symbol file s.json is not an MXNet symbol graph: expected 'nodes' "
                                      "and 'heads'"),
    "an empty params file": (lambda sym, par, tmp: (sym, _write(tmp, "empty.params", b"")),
                             "params file empty.params is not an MXNet params file"),
}


@pytest.mark.parametrize("case", list(MODEL_FILE_CASES), ids=case_id)
def test_bad_model_files_are_refused_in_one_line(workers: Stack, mlp: dict, pids: dict[str, int],
                                                 tmp_path: Path, case: str) -> None:
    make, needle = MODEL_FILE_CASES[case]
    symbol, params = make(Path(mlp["symbol_file"]), Path(mlp["params_file"]), tmp_path)
    before = counts(workers)
    proc = workers.mxq("models", "add", "imported", "--symbol", str(symbol), "--params", str(params),
                       "--input-shape", "64")
    line = one_line(proc.stderr)
    assert proc.returncode == 2 and needle in line and "Traceback" not in line, line
    expect_changes(before, counts(workers), 0)
    still_standing(workers, pids)


def _pickled(stack: Stack) -> None:
    from kombu import Connection

    with Connection(stack.settings.broker) as conn:
        conn.Producer(serializer="pickle").publish(
            {"task": "mxq.probe", "id": "evil", "args": [1], "kwargs": {}},
            routing_key=f"{NODE}.cpu.0", exchange=f"{NODE}.cpu.0",
            headers={"task": "mxq.probe", "id": "evil"})


def _unknown_task(stack: Stack) -> None:
    from mxq.workers.broker.app import app_for

    app_for(stack.settings).send_task("mxq.dance", args=[1], queue=f"{NODE}.cpu.0")


def _no_such_job(stack: Stack) -> None:
    from mxq.workers.broker.app import app_for

    app_for(stack.settings).send_task("mxq.probe", args=[987654], queue=f"{NODE}.cpu.0",
                                             task_id="no-such-job-987654")


def _push(queue: str, item: str) -> Callable[[Stack], None]:
    """Push a raw item onto a queue as kombu stores messages (what any broker client can do)."""
    def push(stack: Stack) -> None:
        from mxq.workers.broker.redis_client import client

        client(stack.settings.broker).lpush(queue, item)
    return push


def _envelope(**changes: Any) -> str:
    """A kombu envelope of a probe message for job 987654, with `changes` made to it."""
    body = base64.b64encode(json.dumps([[987654], {}, {}]).encode()).decode()
    envelope: dict[str, Any] = {"body": body, "content-encoding": "utf-8", "content-type": "application/json",
                "headers": {"task": "mxq.probe", "id": "poison"},
                "properties": {"body_encoding": "base64", "delivery_tag": "poison-tag",
                               "delivery_info": {"exchange": "", "routing_key": "x"}, "priority": 0}}
    for key, value in changes.items():
        if key.startswith("properties."):
            envelope["properties"][key.split(".", 1)[1]] = value
        else:
            envelope[key] = value
    return json.dumps(envelope)


POISON = f"moved an unreadable message of {NODE}.cpu.0 to mxq.dead-letters"
# Messages published straight to cpu:0's queue: (publish, what cpu:0's log must then say).
BROKER_CASES: dict[str, tuple[Callable[[Stack], None], str]] = {
    "body that is not base64": (_push(f"{NODE}.cpu.0", _envelope(body="%%% not base64 %%%")),
                                f"{POISON}: its body is not base64"),
    "bare JSON number": (_push(f"{NODE}.cpu.0", "5"), f"{POISON}: not a message envelope but a JSON int"),
    "JSON list": (_push(f"{NODE}.cpu.0", "[1, 2]"), f"{POISON}: not a message envelope but a JSON list"),
    "not JSON at all": (_push(f"{NODE}.cpu.0", "\x00\xff garbage"), f"{POISON}: not JSON"),
    "envelope without properties": (_push(f"{NODE}.cpu.0", _envelope(properties=None)),
                                    f"{POISON}: its envelope has no properties with a delivery_tag"),
    "unknown body_encoding": (_push(f"{NODE}.cpu.0", _envelope(**{"properties.body_encoding": "rot13"})),
                              f"{POISON}: its body_encoding 'rot13' is not one kombu knows"),
    "headers that are not an object": (_push(f"{NODE}.cpu.0", _envelope(headers=[1])),
                                       f"{POISON}: its headers are not an object"),
    "body that is not base64 on the CPU pool": (
        _push("pool.cpu", _envelope(body="%%% not base64 %%%")),
        "moved an unreadable message of pool.cpu to mxq.dead-letters: its body is not base64"),
    "pickled message": (_pickled,
                        "ContentDisallowed: Refusing to deserialize untrusted content of type pickle"),
    "unknown task name": (_unknown_task, "Received unregistered task of type 'mxq.dance'"),
    "job id that does not exist": (_no_such_job, "no-such-job-987654] succeeded"),
}


@pytest.mark.parametrize("case", list(BROKER_CASES), ids=case_id)
def test_bad_message(workers: Stack, pids: dict[str, int], case: str) -> None:
    """A worker meets the message, logs what it is and goes on: its PID stays the same."""
    publish, needle = BROKER_CASES[case]
    logs = [workers.home / "logs" / f"cpu{i}-{NODE}.log" for i in (0, 1)]

    def logged() -> int:  # a pool message goes to whichever worker takes it
        return sum(log.read_text(errors="replace").count(needle) for log in logs)

    seen = logged()
    before = counts(workers)
    publish(workers)
    wait_until(logged, 60, f"a worker to log {needle!r}", until=lambda count: count > seen)
    expect_changes(before, counts(workers), 0)
    still_standing(workers, pids)
    if "dead-letters" in needle:  # moved aside, where `mxq dead-letters` shows it
        newest = workers.mxq_json("dead-letters")[0]
        assert needle.split(": ", 1)[1] in newest["reason"] and newest["queue"] in needle, newest


def test_a_normal_job_still_succeeds(workers: Stack, client: TestClient, pids: dict[str, int]) -> None:
    """After the corpus: the same workers run a job from the CLI and one from the API; reads
    need the token as writes do."""
    before = counts(workers)
    for device in DEVICES:
        record = workers.mxq_json("infer", "mlp64", ok_input(workers), "--device", device, "--wait")
        assert record["status"] == "succeeded" and record["samples"] == len(ROWS), record
    r = client.post("/api/v1/jobs", json={"kind": "infer", "model": "mlp64", "input": "ok.npy"}, headers=AUTH)
    assert r.status_code == 201, r.text
    assert workers.wait(r.json()["id"])["status"] == "succeeded"
    assert client.get("/api/v1/jobs").status_code == 401
    assert client.get("/api/v1/jobs", headers=AUTH).status_code == 200
    after = counts(workers)
    assert after == {**before, "jobs_not_failed": before["jobs_not_failed"] + 3}, (before, after)
    still_standing(workers, pids)
