"""The bad-input corpus for honest numbers (issue 29, items 1-3): preprocessing float32 cannot
hold, output kinds a model contradicts, and NaN or infinite inputs on every output kind. Each is
answered in one line naming the option, its value and what is allowed, with no traceback and
nothing else lost (no version added; the workers stay up). The harness is tests/support/bad_input.py."""

from __future__ import annotations

import json
from pathlib import Path

import mxnet as mx
import pytest

from mxq.db.migrate import upgrade
from mxq.workers.settings import Settings
from tests.conftest import Stack, run_cli
from tests.support.bad_input import ON_WORKER, case_id, check_job_case, infer, input_with, run_cli_case
from tests.support.bad_input import pids as pids  # a fixture: the workers at the start
from tests.support.messages import one_line

ADD = ["models", "add", "m", "--arch", "mlp", "--input-shape", "4"]
SCALE = "allowed 1.175e-38 to 1.7e+32 (inputs up to 1e+06 in magnitude must stay finite in float32)"
STD = "allowed 2.942e-33 to 3.403e+38 with --scale 1 and largest |mean| 0"
MEAN = "allowed magnitudes up to 1.7e+38"
# `mxq models add` options refused before anything is written: (options, the one line's needle).
MODEL_ADD_CASES = {
    "scale 1e308": (["--scale", "1e308"], f"--scale 1e+308: {SCALE}"),
    "scale 1e-320": (["--scale", "1e-320"], f"--scale 9.99989e-321: {SCALE}"),
    "scale 1e-50 (zero in float32)": (["--scale", "1e-50"], f"--scale 1e-50: {SCALE}"),
    "scale 1e33": (["--scale", "1e33"], f"--scale 1e+33: {SCALE}"),
    "scale a fraction of 400 digits": (["--scale", "9" * 400 + "/7"], "expected a positive number or "
                                       "fraction such as 1/255"),
    "std 1e-50": (["--std", "1e-50"], f"--std 1e-50: {STD}"),
    "std 1e-45 (subnormal)": (["--std", "1e-45"], f"--std 1e-45: {STD}"),
    "std 1e-35 (inputs of 1e6 overflow)": (["--std", "1e-35"], f"--std 1e-35: {STD}"),
    "std 1e39 (inf in float32)": (["--std", "1e39"], f"--std 1e+39: {STD}"),
    "std too small for its scale": (["--scale", "1e30", "--std", "1e-5"],
                                    "--std 1e-05: allowed 0.002942 to 3.403e+38 with --scale 1e+30"),
    "mean 1e39": (["--mean", "1e39"], f"--mean 1e+39: {MEAN}"),
    "mean -1e39": (["--mean", "-1e39"], f"--mean 1e+39: {MEAN}"),
    "outputs maybe": (["--outputs", "maybe"], "--outputs 'maybe': allowed: auto, logits, probabilities"),
    "outputs probabilities for a built-in": (["--outputs", "probabilities"],
                                             "--outputs probabilities: a built-in architecture outputs "
                                             "logits; allowed with --arch: auto or logits"),
}


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """A migrated home of its own (no workers): `models add` needs nothing else."""
    upgrade(Settings(home=tmp_path).database)
    return {"MXQ_HOME": str(tmp_path)}


def _versions(env: dict[str, str]) -> list:
    listed = run_cli(["models", "--json"], env)
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


@pytest.mark.parametrize("case", MODEL_ADD_CASES, ids=case_id)
def test_bad_model_numbers_are_refused_in_one_line(home: dict[str, str], case: str) -> None:
    options, needle = MODEL_ADD_CASES[case]
    proc = run_cli([*ADD, *options], home)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert needle in one_line(proc.stderr), proc.stderr
    assert _versions(home) == []


def _export(folder: Path, softmax: bool) -> list[str]:
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(5))
    if softmax:
        net.add(mx.gluon.nn.HybridLambda(lambda F, x: F.softmax(x)))
    net.initialize()
    net.hybridize()
    net(mx.nd.zeros((1, 4)))
    net.export(str(folder / "user"))
    return ["--symbol", str(folder / "user-symbol.json"), "--params", str(folder / "user-0000.params"),
            "--input-shape", "4"]


@pytest.mark.parametrize(("softmax", "stated", "needle"), [
    (True, "logits", "--outputs logits: the model outputs probabilities (its last op is softmax), and "
                     "a softmax of them would squash every score; allowed: --outputs probabilities or auto"),
    (False, "probabilities", "--outputs probabilities: the model's outputs on 3 random samples are not "
                             "probabilities (row sums"),
])
def test_an_output_kind_the_model_contradicts_is_refused_in_one_line(
        home: dict[str, str], tmp_path: Path, softmax: bool, stated: str, needle: str) -> None:
    proc = run_cli(["models", "add", "user", *_export(tmp_path, softmax), "--outputs", stated], home)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert needle in one_line(proc.stderr), proc.stderr
    assert _versions(home) == []


FINITE_ONLY = "(mxq scores finite inputs only: fix or drop that sample)"
# Without --reject-nan, on every output kind: before, db failed with an IntegrityError and
# Parquet or npy succeeded with NaN scores (MXNet: a uniform 0.1).
JOB_CASES = {
    "NaN to db": infer(input_with(float("nan")), f"has NaN in sample 5 {FINITE_ONLY}", ON_WORKER),
    "inf to db": infer(input_with(float("inf")), f"has inf in sample 5 {FINITE_ONLY}", ON_WORKER),
    "-inf to db": infer(input_with(float("-inf")), f"has -inf in sample 5 {FINITE_ONLY}", ON_WORKER),
    "NaN to parquet": infer(input_with(float("nan")), f"has NaN in sample 5 {FINITE_ONLY}", ON_WORKER,
                            output="parquet"),
    "inf to npy on ONNX Runtime": infer(input_with(float("inf")), f"has inf in sample 5 {FINITE_ONLY}",
                                        ON_WORKER, output="npy", engine="onnx"),
}


@pytest.mark.parametrize("case", JOB_CASES, ids=case_id)
def test_non_finite_inputs_fail_their_job_on_every_output_kind(workers: Stack, pids: dict[str, int],
                                                                case: str) -> None:
    c = JOB_CASES[case]
    check_job_case(workers, pids, c, lambda p: run_cli_case(workers.mxq, workers, c, p))
