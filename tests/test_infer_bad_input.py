"""Bad inference input: each a failed job whose message names the problem; the worker goes on."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable

import numpy as np
import pytest

from tests.conftest import Stack

ROWS = np.random.default_rng(0).normal(size=(40, 64)).astype(np.float32)


def _save(stack: Stack, name: str, array: np.ndarray) -> str:
    np.save(stack.home / "data" / name, array)
    return name


def _truncated(stack: Stack) -> str:
    name = _save(stack, "cut.npy", ROWS)
    path = stack.home / "data" / name
    path.write_bytes(path.read_bytes()[:-500])
    return name


def _outside(stack: Stack) -> str:
    np.save(stack.home / "outside.npy", ROWS)
    return "../outside.npy"


def _with_nan(stack: Stack) -> str:
    bad = ROWS.copy()
    bad[5, 3] = np.nan
    return _save(stack, "nan.npy", bad)


def _tampered(stack: Stack) -> str:
    """A stored params file replaced after registration (so it no longer matches its symbol)."""
    fragile = stack.mxq_json("models", "add", "fragile", "--arch", "mlp", "--input-shape", "64")
    other = stack.mxq_json("models", "add", "other", "--arch", "mlp", "--input-shape", "64",
                           "--classes", "3")
    shutil.copyfile(other["params_file"], fragile["params_file"])
    return _save(stack, "ok.npy", ROWS)


# case: (make the input, options of `mxq infer`, what the error must say); the model is mlp64
# unless the options name another with --model.
CASES: dict[str, tuple[Callable[[Stack], str], list[str], str]] = {
    "missing file": (lambda s: "missing.npy", [], "input missing.npy does not exist"),
    "outside the data root": (_outside, [], "lies outside the data root"),
    "truncated npy": (_truncated, [], "is truncated or corrupt"),
    "wrong shape": (lambda s: _save(s, "narrow.npy", ROWS[:, :32]), [],
                    "has samples of shape (32,) but model expects (64,)"),
    "wrong dtype": (lambda s: _save(s, "complex.npy", ROWS.astype(np.complex64)), [],
                    "has dtype complex64; allowed"),
    "NaN with --reject-nan": (_with_nan, ["--reject-nan"], "has NaN in sample 5"),
    "empty input": (lambda s: _save(s, "empty.npy", np.zeros((0, 64), np.float32)), [],
                    "holds no samples"),
    "unknown model": (lambda s: _save(s, "ok.npy", ROWS), ["--model", "nosuch"],
                      "unknown model 'nosuch'; known models:"),
    "unknown version": (lambda s: _save(s, "ok.npy", ROWS), ["--model", "mlp64:9"],
                        "model 'mlp64' has no version 9; versions: 1"),
    "batch size 0": (lambda s: _save(s, "ok.npy", ROWS), ["--batch-size", "0"],
                     "batch_size=0: Input should be greater than or equal to 1"),
    "batch size above the limit": (lambda s: _save(s, "ok.npy", ROWS), ["--batch-size", "100000"],
                                   "batch_size=100000: Input should be less than or equal to 65536"),
    "top-k above the classes": (lambda s: _save(s, "ok.npy", ROWS), ["--top-k", "11"],
                                "top-k 11 exceeds the 10 classes of mlp64:1"),
    "params that do not match the symbol": (_tampered, ["--model", "fragile"],
                                            "does not match its recorded checksum"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_fails_the_job_with_a_clear_message(workers: Stack, mlp: dict, case: str) -> None:
    make, extra, needle = CASES[case]
    name = make(workers)
    model = "mlp64"
    if "--model" in extra:
        model, extra = extra[1], extra[2:]
    proc = workers.mxq("infer", model, name, "--device", "cpu:0", *extra, "--wait", "--json")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    if proc.stdout.strip():  # failed on the worker: the record is printed
        record = json.loads(proc.stdout)
    else:  # refused at submit: one line naming the job and the problem
        line = proc.stderr.strip()
        assert line.startswith("mxq: error: job ") and len(line.splitlines()) == 1
        record = workers.mxq_json("job", line.split()[3])
    assert record["status"] == "failed"
    assert needle in record["error"], record["error"]
    devices = {d["device"]: d["alive"] for d in workers.mxq_json("devices")}
    assert devices["cpu:0"] is True
    after = workers.mxq_json("infer", "mlp64", _save(workers, "ok.npy", ROWS), "--device", "cpu:0",
                             "--wait")
    assert after["status"] == "succeeded"
