"""Honest numbers (issue 29, items 1-3): what a model outputs is known and softmax is applied once;
preprocessing keeps every input finite in float32; a non-finite input or output fails the job,
naming the sample, on every engine and output kind; JSON output is valid JSON."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import mxnet as mx
import numpy as np
import pytest
from sqlalchemy import text

from mxq.cli import render
from mxq.db.engine import get_engine
from mxq.db.migrate import upgrade
from mxq.db.registry import list_models
from mxq.device import Device
from mxq.preprocess import FLOAT32_TINY, INPUT_BOUND, Preprocess, PreprocessError
from mxq.tasks.inference import engines, infer
from mxq.tasks.inference.batch_fit import BatchFit
from mxq.tasks.inference.inputs import InputSource
from mxq.tasks.job_context import JobInputError
from mxq.tasks.model_store.model_error import ModelError
from mxq.tasks.model_store.mxnet.versions import add_builtin, add_exported
from mxq.workers.fleet.hang_watch import DeviceWatch
from mxq.workers.settings import Settings
from tests.conftest import Stack, run_cli
from tests.support.inference import infer_and_wait, save_npy

if TYPE_CHECKING:
    from mxq.db.records import ModelRecord
    from mxq.tasks.job_context import JobContext


def _export(folder: Path, name: str, *tail: mx.gluon.HybridBlock) -> tuple[Path, Path, Any]:
    """A user's 12-input, 5-class net ending in `tail`, exported: (symbol, params, net)."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(16, activation="tanh"), mx.gluon.nn.Dense(5), *tail)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, 12)))
    net.export(str(folder / name))
    return folder / f"{name}-symbol.json", folder / f"{name}-0000.params", net


def _lambda(f: Any) -> mx.gluon.HybridBlock:
    return mx.gluon.nn.HybridLambda(f)


SHARP = 40.0  # logits scaled so that most rows put nearly all probability on one class
PROBABILITY_TAILS = {  # how a user's net may end in a softmax, and how mxq tells
    "last op softmax": [_lambda(lambda F, x: F.softmax(x * SHARP))],
    "softmax then flatten": [_lambda(lambda F, x: F.softmax(x * SHARP)), mx.gluon.nn.Flatten()],
    "softmax then a no-op product (trial run)": [_lambda(lambda F, x: F.softmax(x * SHARP) * 1.0)],
}


@pytest.mark.parametrize("tail", PROBABILITY_TAILS, ids=lambda t: t.replace(" ", "-"))
def test_a_model_that_outputs_probabilities_is_scored_as_it_is_on_both_engines(
        store: Settings, tmp_path: Path, tail: str) -> None:
    symbol, params, net = _export(tmp_path, "probs", *PROBABILITY_TAILS[tail])
    model = add_exported(store, "probs", symbol, params, (12,))
    assert model["outputs"] == "probabilities"
    assert list_models(store.database, "probs")[0]["outputs"] == "probabilities"
    x = np.random.default_rng(1).standard_normal((32, 12)).astype(np.float32)
    own = net(mx.nd.array(x)).asnumpy()
    assert own.max() > 0.99  # a class the model gives probability ~1.0 (0.232 before the fix)
    ours = engines.mxnet_engine(store, model, Device("cpu", 0), "").forward(x)
    np.testing.assert_allclose(ours, own, atol=1e-6)
    assert model["onnx"] is not None and model["onnx"]["file"], model["onnx"]
    np.testing.assert_allclose(engines.onnx_engine(store, model, "cpu", "").forward(x), own, atol=1e-5)


def test_logits_and_log_softmax_get_one_softmax(store: Settings, tmp_path: Path) -> None:
    """A softmax of log-probabilities gives the probabilities back: log_softmax counts as logits."""
    x = np.random.default_rng(2).standard_normal((8, 12)).astype(np.float32)
    for name, tail in (("plain", []), ("logsm", [_lambda(lambda F, x: F.log_softmax(x))])):
        symbol, params, net = _export(tmp_path, name, *tail)
        model = add_exported(store, name, symbol, params, (12,))
        assert model["outputs"] == "logits"
        expected = mx.nd.softmax(net(mx.nd.array(x))).asnumpy()
        served = engines.mxnet_engine(store, model, Device("cpu", 0), "").forward(x)
        np.testing.assert_allclose(served, expected, atol=1e-6)
    assert add_builtin(store, "b", "mlp", (12,), 3)["outputs"] == "logits"


def test_a_stated_output_kind_the_model_contradicts_is_refused(store: Settings, tmp_path: Path) -> None:
    symbol, params, _ = _export(tmp_path, "probs", *PROBABILITY_TAILS["last op softmax"])
    with pytest.raises(ModelError, match=r"^--outputs logits: the model outputs probabilities "
                                         r"\(its last op is softmax\).*allowed: --outputs probabilities"):
        add_exported(store, "p", symbol, params, (12,), outputs="logits")
    symbol, params, _ = _export(tmp_path, "plain")
    with pytest.raises(ModelError, match=r"^--outputs probabilities: the model's outputs on 3 random "
                                         r"samples are not probabilities \(row sums .*allowed"):
        add_exported(store, "q", symbol, params, (12,),
                     outputs="probabilities")
    stated = add_exported(store, "r", symbol, params, (12,), outputs="logits")
    assert stated["outputs"] == "logits"
    assert list_models(store.database) == [stated]  # the refused ones left no version


def test_models_json_shows_the_output_kind(store: Settings) -> None:
    env = {"MXQ_HOME": str(store.home_path)}
    added = run_cli(["models", "add", "m", "--arch", "mlp", "--input-shape", "4", "--json"], env)
    assert added.returncode == 0, added.stderr
    shown = run_cli(["models", "m", "--json"], env)
    assert [v["outputs"] for v in json.loads(shown.stdout)] == ["logits"]
    refused = run_cli(["models", "add", "n", "--arch", "mlp", "--input-shape", "4", "--outputs",
                       "probabilities"], env)
    assert refused.returncode == 2 and "a built-in architecture outputs logits" in refused.stderr


def test_versions_from_before_0016_output_logits(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url, "0015")
    with get_engine(url).begin() as conn:
        conn.execute(text("INSERT INTO models (id, name, version, arch, input_shape, classes, "
                          "params_file, checksum, created_at, source, promoted, metrics) VALUES "
                          "(1, 'old', 1, 'mlp', '[4]', 3, 'p', 'c', '2026-01-01 00:00:00', 'builtin', "
                          "0, '{}')"))
    assert upgrade(url, "0016") == ["0016"]
    upgrade(url)  # the code reads the newest schema
    assert list_models(url, "old")[0]["outputs"] == "logits"


# --- preprocessing that float32 cannot hold ---------------------------------------------------

@pytest.mark.parametrize(("options", "needle"), [
    ({"scale": "1e308"}, "--scale 1e+308: allowed 1.175e-38 to 1.7e+32"),
    ({"scale": "1e-320"}, "--scale 9.99989e-321: allowed 1.175e-38 to"),
    ({"std": "1e-50"}, "--std 1e-50: allowed 2.942e-33 to 3.403e+38"),
    ({"std": "1e-45"}, "--std 1e-45: allowed 2.942e-33 to 3.403e+38"),
    ({"mean": "1e39"}, "--mean 1e+39: allowed magnitudes up to 1.7e+38"),
    ({"mean": "0,-1e39,0"}, "--mean 1e+39: allowed magnitudes up to 1.7e+38"),
    ({"scale": "1e30", "std": "1e-5"}, "--std 1e-05: allowed 0.002942 to 3.403e+38 with --scale 1e+30"),
    ({"scale": "1" * 400 + "/3"}, "--scale '1111"),
])
def test_preprocessing_float32_cannot_hold_is_refused(options: dict[str, str], needle: str) -> None:
    with pytest.raises(PreprocessError) as info:
        Preprocess.parse(**options)
    assert needle in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("spec", [Preprocess(FLOAT32_TINY), Preprocess(1.69e32), Preprocess(1 / 255),
                                  Preprocess(1.0, (1.69e38,), (1.0,)), Preprocess(1.0, None, (2.95e-33,)),
                                  Preprocess(1e30, (-1e38,), (0.3,)),
                                  Preprocess(1.69e32, (1.69e38,), (1.0,))])
def test_allowed_preprocessing_keeps_every_bounded_input_finite(spec: Preprocess) -> None:
    spec.check_range()
    x = np.array([[INPUT_BOUND], [-INPUT_BOUND], [1.0], [0.0]], np.float32)
    with np.errstate(all="raise"):  # overflow (or invalid) in float32 raises here
        assert np.isfinite(spec.apply(x)).all()


# --- non-finite values: one rule ------------------------------------------------------------

def _model(classes: int = 3) -> ModelRecord:
    """The fields of a version that the engines' output check reads."""
    return cast("ModelRecord", {"name": "m", "version": 1, "classes": classes})


@pytest.mark.parametrize(("value", "found"), [(np.nan, "NaN"), (np.inf, "inf"), (-np.inf, "-inf")])
def test_a_non_finite_output_names_its_sample_whatever_the_engine(value: float, found: str) -> None:
    def forward(x: np.ndarray) -> np.ndarray:
        out = np.full((len(x), 3), 1 / 3, np.float32)
        out[np.isin(x[:, 0], [7.0]), 1] = value
        return out

    x = np.arange(10, dtype=np.float32)[:, None]
    engine = engines.Engine("onnx", engines._checked(_model(), forward), lambda: None, False, "")
    # a fit that never halves records nothing; its batches run under a watch
    no_job = cast("JobContext", SimpleNamespace(watch=DeviceWatch(300, 10)))
    fit = BatchFit(no_job, 4)  # slices [0,4) [4,8) [8,10): sample 7 in the second
    with pytest.raises(engines.NonFiniteOutput) as info:
        fit.predict(engine, x)
    assert (info.value.row, info.value.found) == (7, found)
    said = info.value.describe(1234, x[7])
    assert said.startswith(f"model output for sample 1234 is {found}: its input is finite "
                           "(largest magnitude 7 after preprocessing), so the model overflows")
    assert "its input holds NaN or inf" in info.value.describe(3, np.array([np.nan]))


@pytest.mark.parametrize("reject_nan", [False, True])
def test_a_non_finite_input_fails_with_or_without_reject_nan(reject_nan: bool) -> None:
    """MXNet's CPU ReLU answers NaN with 0 (a uniform 0.1), ONNX Runtime with NaN: so no engine
    ever sees one."""
    p = SimpleNamespace(input="x.npy", reject_nan=reject_nan)
    x = np.zeros((6, 4), np.float32)
    x[4, 2] = -np.inf
    why = "--reject-nan is set" if reject_nan else "mxq scores finite inputs only"
    source = InputSource(Path("x.npy"), 106, (4,), lambda a, b: np.zeros((b - a, 4)))
    with pytest.raises(JobInputError, match=rf"^input x.npy has -inf in sample 104 \({why}"):
        infer._check_finite(p, source, 100, x)  # type: ignore[arg-type]
    huge = np.full((2, 4), 3e38, np.float32)  # its float32 row sums overflow, yet it is finite
    infer._check_finite(p, source, 0, huge)  # type: ignore[arg-type]


def test_json_output_is_valid_json_with_null_for_non_finite(capsys: pytest.CaptureFixture[str]) -> None:
    render.print_json([{"index": 0, "score": float("nan"), "top_k": [[1, float("inf")]]},
                       {"index": 1, "score": 0.5, "top_k": None}])

    def refuse(name: str) -> None:
        raise ValueError(f"bare {name} is not JSON")

    rows = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert rows == [{"index": 0, "score": None, "top_k": [[1, None]]},
                    {"index": 1, "score": 0.5, "top_k": None}]


def test_a_nan_input_fails_the_job_on_both_engines_to_the_database(workers: Stack, mlp: dict) -> None:
    """Before: MXNet answered a uniform 0.1 (the job succeeded) and ONNX Runtime NaN (an
    IntegrityError on predictions.score); now both fail naming the sample."""
    x = np.random.default_rng(3).standard_normal((30, 64)).astype(np.float32)
    x[17, 5] = np.nan
    save_npy(workers, "nan-honest.npy", x)
    for engine in ("mxnet", "onnx"):
        job = infer_and_wait(workers, "mlp64", "nan-honest.npy", "--engine", engine, "--output", "db")
        assert job["status"] == "failed", job
        assert job["error"].endswith("/nan-honest.npy has NaN in sample 17 (mxq scores finite "
                                     "inputs only: fix or drop that sample)"), job["error"]


def test_preprocessing_that_overflows_a_finite_sample_is_blamed_not_the_input(workers: Stack) -> None:
    """A --std the range check allows (inputs up to INPUT_BOUND stay finite) turns a finite
    1e10 into inf: the error names the version's preprocessing, not the input ("has inf in sample
    300" before); a sample that is itself inf still names the input."""
    proc = workers.mxq("models", "add", "tiny-std", "--arch", "mlp", "--input-shape", "64",
                       "--classes", "10", "--std", "1e-30")
    assert proc.returncode == 0, proc.stderr
    x = np.random.default_rng(4).standard_normal((400, 64)).astype(np.float32)
    x[300, 3] = 1e10
    save_npy(workers, "tiny-std.npy", x)
    job = infer_and_wait(workers, "tiny-std", "tiny-std.npy", "--output", "db")
    assert job["status"] == "failed", job
    assert job["error"].startswith("model tiny-std:1's preprocessing (x*1 /1e-30 NCHW) turns "
                                   "sample 300 of input "), job["error"]
    assert job["error"].split("tiny-std.npy ", 1)[1].startswith(
        "into inf; the sample itself is finite"), job["error"]
    x[300, 3] = np.inf
    save_npy(workers, "tiny-std-inf.npy", x)
    job = infer_and_wait(workers, "tiny-std", "tiny-std-inf.npy", "--output", "db")
    assert job["error"].endswith("/tiny-std-inf.npy has inf in sample 300 (mxq scores finite "
                                 "inputs only: fix or drop that sample)"), job["error"]
