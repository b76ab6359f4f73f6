"""ONNX as exporters write it (issue 62): scikit-learn models exported by skl2onnx, and LightGBM
and XGBoost models by onnxmltools, the usual way, register as exported (a classifier's label
output beside its probabilities, as a tensor or through ZipMap's maps; a regressor's values) and
serve what the library's own `predict_proba` / `predict` give, through the registration's own
check and through real workers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from skl2onnx import to_onnx
from sklearn.datasets import load_digits
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from mxq.tasks.model_store.onnx_import import add_onnx
from mxq.tasks.runtimes import onnx_runtime
from mxq.workers.settings import Settings
from tests.conftest import Stack

OPSETS = {"": 17, "ai.onnx.ml": 3}


def _digits() -> tuple[np.ndarray, np.ndarray]:
    d = load_digits()
    return d.data.astype(np.float32), d.target


def _exported(path: Path, model: Any, zipmap: bool = True) -> Path:
    """`model`, fitted on the digits, exported by skl2onnx as a team would (ZipMap kept, the
    default, or `zipmap: False`)."""
    x, y = _digits()
    model.fit(x, y)
    last = model.steps[-1][1] if hasattr(model, "steps") else model
    options = None if zipmap or not hasattr(last, "predict_proba") else {id(last): {"zipmap": False}}
    path.write_bytes(to_onnx(model, x[:1], options=options, target_opset=OPSETS).SerializeToString())
    return path


CLASSIFIERS = {
    "scaled-logistic": lambda: make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)),
    "random-forest": lambda: RandomForestClassifier(n_estimators=20, random_state=0),
    "mlp": lambda: MLPClassifier(hidden_layer_sizes=(32,), max_iter=300, random_state=0),
}


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("zipmap", [True, False], ids=["zipmap", "tensor"])
@pytest.mark.parametrize("kind", list(CLASSIFIERS))
def test_a_classifier_registers_as_exported_and_serves_its_probabilities(
        store: Settings, tmp_path: Path, kind: str, zipmap: bool) -> None:
    model = CLASSIFIERS[kind]()
    path = _exported(tmp_path / f"{kind}.onnx", model, zipmap)
    record = add_onnx(store, kind.replace("-", ""), path, None)
    assert (record["outputs"], record["classes"], record["input_shape"]) == ("probabilities", 10, [64])
    onnx_record = record["onnx"] or {}
    labels = onnx_record.get("class_labels")
    assert labels is None or labels == list(range(10))  # the label output's classes, when named
    x, _ = _digits()
    served = onnx_runtime.run(onnx_runtime.session(Path(onnx_record["file"]))[0], x)
    theirs = model.predict_proba(x)
    assert (served.argmax(axis=1) == theirs.argmax(axis=1)).mean() == 1.0
    np.testing.assert_allclose(served, theirs, atol=1e-4)


def test_a_regressor_registers_and_serves_its_values(store: Settings, tmp_path: Path) -> None:
    model = Ridge()
    record = add_onnx(store, "ridge", _exported(tmp_path / "ridge.onnx", model), None)
    assert (record["outputs"], record["classes"]) == ("regression", 1)
    x, _ = _digits()
    served = onnx_runtime.run(onnx_runtime.session(Path((record["onnx"] or {})["file"]))[0], x)
    np.testing.assert_allclose(served[:, 0], model.predict(x), rtol=1e-4, atol=1e-4)


GBM_OPSET = 15  # the newest onnxmltools 1.16 converts to
# Each boosted model: its library, its class, and the converter's ZipMap choices (XGBoost's has
# none). The libraries load in the tests that use them, not at collection (each brings OpenMP).
BOOSTED: dict[str, tuple[str, str, tuple[bool | None, ...]]] = {
    "lightgbm": ("lightgbm", "LGBMClassifier", (True, False)),
    "xgboost": ("xgboost", "XGBClassifier", (None,)),
    "lightgbm-regressor": ("lightgbm", "LGBMRegressor", (None,)),
    "xgboost-regressor": ("xgboost", "XGBRegressor", (None,)),
}


def _boosted(path: Path, kind: str, zipmap: bool | None) -> tuple[Any, Path]:
    """A LightGBM or XGBoost model fitted on the digits and exported by onnxmltools as its docs
    show (`zipmap` where the converter has the option)."""
    import importlib

    import onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType

    library, name, _ = BOOSTED[kind]
    quiet = {"verbose": -1} if library == "lightgbm" else {}
    model = getattr(importlib.import_module(library), name)(n_estimators=20, **quiet)
    convert = getattr(onnxmltools, f"convert_{library}")
    x, y = _digits()
    model.fit(x, y)
    options = {} if zipmap is None else {"zipmap": zipmap}
    graph = convert(model, initial_types=[("input", FloatTensorType([None, 64]))],
                    target_opset=GBM_OPSET, **options)
    path.write_bytes(graph.SerializeToString())
    return model, path


@pytest.mark.parametrize(("kind", "zipmap"), [(k, z) for k, (_, _, zs) in BOOSTED.items() for z in zs])
def test_a_boosted_model_registers_as_exported_and_serves_its_outputs(
        store: Settings, tmp_path: Path, kind: str, zipmap: bool | None) -> None:
    model, path = _boosted(tmp_path / f"{kind}.onnx", kind, zipmap)
    record = add_onnx(store, kind.replace("-", ""), path, None)
    x, _ = _digits()
    served = onnx_runtime.run(onnx_runtime.session(Path((record["onnx"] or {})["file"]))[0], x)
    if kind.endswith("regressor"):
        assert (record["outputs"], record["classes"]) == ("regression", 1)
        np.testing.assert_allclose(served[:, 0], model.predict(x), rtol=1e-4, atol=1e-4)
        return
    assert (record["outputs"], record["classes"], record["input_shape"]) == ("probabilities", 10, [64])
    theirs = model.predict_proba(x)
    assert (served.argmax(axis=1) == theirs.argmax(axis=1)).mean() == 1.0
    np.testing.assert_allclose(served, theirs, atol=1e-4)


# Every exporter's model, through `mxq models add` and `mxq infer` on real workers: a classifier
# of each exporter with the default export (ZipMap where it has one), and a regressor of each.
THROUGH_WORKERS = ["skl2onnx-logistic", "skl2onnx-forest", "skl2onnx-mlp", "skl2onnx-ridge",
                   "lightgbm", "xgboost", "lightgbm-regressor", "xgboost-regressor"]


def _any_exported(path: Path, kind: str) -> Any:
    """The fitted model of `kind` (THROUGH_WORKERS), exported to `path` by its exporter."""
    if kind in BOOSTED:
        return _boosted(path, kind, BOOSTED[kind][2][0])[0]
    sklearn_kind = {"skl2onnx-logistic": "scaled-logistic", "skl2onnx-forest": "random-forest",
                    "skl2onnx-mlp": "mlp"}.get(kind)
    model = CLASSIFIERS[sklearn_kind]() if sklearn_kind else Ridge()
    _exported(path, model)
    return model


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("kind", THROUGH_WORKERS)
def test_each_exporters_model_serves_through_real_workers(workers: Stack, tmp_path: Path,
                                                          kind: str) -> None:
    """Every stored class and score (or value) is the library's own."""
    name = f"exp-{kind}"
    model = _any_exported(tmp_path / f"{kind}.onnx", kind)
    added = workers.mxq("models", "add", name, "--onnx", str(tmp_path / f"{kind}.onnx"))
    assert added.returncode == 0, added.stderr
    x, _ = _digits()
    np.save(workers.home / "data" / f"{name}.npy", x)
    out = [] if hasattr(model, "predict_proba") else ["--output", "npy"]
    job = workers.mxq_json("infer", name, f"{name}.npy", *out, "--wait")
    assert job["status"] == "succeeded", job["error"]
    if not hasattr(model, "predict_proba"):  # a regressor: its values, as stored
        np.testing.assert_allclose(np.load(job["output"])[:, 0], model.predict(x), rtol=1e-4, atol=1e-4)
        return
    shown = workers.mxq("results", str(job["id"]), "--format", "json", "--limit", "2000")
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    theirs = model.predict_proba(x)
    assert [r["predicted_class"] for r in rows] == list(theirs.argmax(axis=1))
    np.testing.assert_allclose([r["score"] for r in rows], theirs.max(axis=1), atol=1e-4)
