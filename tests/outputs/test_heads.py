"""A model with several outputs (issue 48): `--outputs NAME=KIND,…` names each head in order;
a job writes `job-ID.NAME.npy` per head, or Parquet columns per head (a classifier head's class,
score and top-k beside its probabilities), on both engines, each equal to plain MXNet's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
import pyarrow.parquet as pq
import pytest

from mxq.client import Client
from mxq.client import job as client_job
from mxq.errors import NotFound
from mxq.tasks.model_store.model_error import ModelError
from mxq.tasks.model_store.mxnet.versions import add_exported
from mxq.workers.settings import Settings
from tests.api_server import Api, start_api
from tests.conftest import Stack
from tests.support.inference import infer_and_wait, save_npy


class TwoHeads(mx.gluon.HybridBlock):
    """A class (5 logits) and a box (4 regression values) from one body."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mx.gluon.nn.Dense(16, activation="tanh")
        self.cls = mx.gluon.nn.Dense(5)
        self.box = mx.gluon.nn.Dense(4)

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        h = self.body(x)
        return self.cls(h), self.box(h)


def _export(folder: Path) -> tuple[Path, Path, TwoHeads]:
    mx.random.seed(3)
    net = TwoHeads()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, 12)))
    net.export(str(folder / "two"))
    return folder / "two-symbol.json", folder / "two-0000.params", net


def _added(stack: Stack, name: str, folder: Path) -> tuple[str, TwoHeads]:
    """The two-headed net exported into `folder` and registered as `name` through the CLI:
    its NAME:VERSION and the net."""
    symbol, params, net = _export(folder)
    proc = stack.mxq("models", "add", name, "--symbol", str(symbol), "--params", str(params),
                     "--input-shape", "12", "--outputs", "cls=logits,box=regression", "--json")
    assert proc.returncode == 0, proc.stderr
    return f"{name}:{json.loads(proc.stdout)['version']}", net


def _expected(net: TwoHeads, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cls, box = net(mx.nd.array(x))
    return mx.nd.softmax(cls).asnumpy(), box.asnumpy()


def test_each_head_is_named_checked_and_exported(store: Settings, tmp_path: Path) -> None:
    symbol, params, _ = _export(tmp_path)
    model = add_exported(store, "heads-two", symbol, params, (12,), outputs="cls=auto,box=regression")
    assert model["outputs"] == "heads" and model["classes"] == 9
    assert model["heads"] == [{"name": "cls", "kind": "logits", "width": 5},
                              {"name": "box", "kind": "regression", "width": 4}]
    assert model["onnx"] is not None and model["onnx"]["argmax_agreement"] == 1.0, model["onnx"]
    assert "cls: argmax agreement; box: samples within 1%" in model["onnx"]["measure"]
    for outputs, words in [("auto", "has 2 outputs (") , ("cls=logits", "allowed: 2 to 16 outputs"),
                           ("cls=logits,box=logits,x=auto", "--outputs names 3"),
                           ("cls=probabilities,box=regression", "output cls: its rows do not sum to 1"),
                           ("cls=logits,index=regression", "output name 'index'")]:
        with pytest.raises(ModelError, match=None) as refused:
            add_exported(store, "heads-two", symbol, params, (12,), outputs=outputs)
        assert words in str(refused.value), str(refused.value)


@pytest.mark.parametrize("engine", ["mxnet", "onnx"])
def test_a_job_writes_each_head_as_npy_and_parquet(workers: Stack, tmp_path: Path, engine: str) -> None:
    label, net = _added(workers, "heads-job", tmp_path)
    x = np.random.default_rng(8).standard_normal((4_000, 12)).astype(np.float32)
    save_npy(workers, f"heads-{engine}.npy", x)
    cls, box = _expected(net, x)

    job = infer_and_wait(workers, label, f"heads-{engine}.npy", "--output", "npy", "--engine", engine,
                         "--chunk-size", "1500")
    assert job["status"] == "succeeded", job["error"]
    files = job["result"]["output_files"]
    assert [Path(f).name for f in files.values()] == [f"job-{job['id']}.cls.npy", f"job-{job['id']}.box.npy"]
    np.testing.assert_allclose(np.load(files["cls"]), cls, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.load(files["box"]), box, rtol=1e-5, atol=1e-5)
    refused = workers.mxq("results", str(job["id"]))
    assert refused.returncode != 0 and "several outputs'" in refused.stderr, refused.stderr

    job = infer_and_wait(workers, label, f"heads-{engine}.npy", "--output", "parquet", "--engine", engine,
                         "--top-k", "2")
    assert job["status"] == "succeeded", job["error"]
    table = pq.read_table(job["output"])
    assert table.column_names == ["index", "cls", "cls_class", "cls_score", "cls_top_k_classes",
                                  "cls_top_k_scores", "box"]
    assert np.array_equal(table.column("cls_class").to_numpy(), cls.argmax(axis=1))
    np.testing.assert_allclose(np.stack(table.column("box").to_numpy(zero_copy_only=False)), box,
                               rtol=1e-5, atol=1e-5)
    assert table.column("cls_top_k_classes")[7].as_py() == np.argsort(-cls[7])[:2].tolist()


def test_rows_and_a_threshold_are_refused_at_submit(workers: Stack, tmp_path: Path) -> None:
    label, _ = _added(workers, "heads-refused", tmp_path)
    symbol, params = tmp_path / "two-symbol.json", tmp_path / "two-0000.params"
    save_npy(workers, "heads-refused.npy", np.zeros((4, 12), np.float32))
    for args, words in [((), f"--output db: {label} has 2 outputs (cls=logits, box=regression)"),
                        (("--output", "npy", "--threshold", "0.5"), f"no output of {label} is multi")]:
        refused = workers.mxq("infer", label, "heads-refused.npy", *args)
        assert refused.returncode != 0 and words in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    bad = workers.mxq("models", "add", "heads-bad", "--symbol", str(symbol), "--params", str(params),
                      "--input-shape", "12", "--outputs", "cls=logits,box=vector")
    assert bad.returncode != 0 and "box='vector'" in bad.stderr, bad.stderr


def test_a_multilabel_head_keeps_its_labels_in_its_own_column() -> None:
    from mxq.db.outputs import parquet

    tags = np.array([[0.9, 0.2, 0.6], [0.1, 0.3, 0.2]], np.float32)
    score = np.array([[1.5], [-2.0]], np.float32)
    table = parquet.from_heads(10, np.concatenate([tags, score], axis=1),
                               [{"name": "tags", "kind": "multilabel", "width": 3},
                                {"name": "score", "kind": "regression", "width": 1}], 0, 0.5)
    assert table.column_names == ["index", "tags", "tags_labels", "score"]
    assert table.column("index").to_pylist() == [10, 11]
    assert table.column("tags_labels").to_pylist() == [[0, 2], []]
    assert table.column("score").to_pylist() == [1.5, -2.0]


TOKEN = "heads-values-token-5c1d"


@pytest.fixture(scope="module")
def api(workers: Stack) -> Iterator[Api]:
    yield from start_api(workers, TOKEN, "api-values")


def test_the_client_reads_each_outputs_values_a_page_at_a_time(workers: Stack, api: Api, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    label, net = _added(workers, "heads-client", tmp_path)
    x = np.random.default_rng(9).standard_normal((2_500, 12)).astype(np.float32)
    save_npy(workers, "heads-client.npy", x)
    cls, box = _expected(net, x)
    monkeypatch.setattr(client_job, "PAGE", 1_000)  # three pages
    with Client(api.url, token=TOKEN) as client:
        for output in ("npy", "parquet"):
            job = client.infer(label, "heads-client.npy", output=output).wait(timeout=300)
            assert job.status == "succeeded", job.record["error"]
            np.testing.assert_allclose(job.values("cls"), cls, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(job.values("box"), box, rtol=1e-5, atol=1e-5)
            with pytest.raises(NotFound, match=r"has 2 outputs \(cls, box\): name one"):
                job.values()
            with pytest.raises(NotFound, match="has no output 'score'; its outputs: cls, box"):
                job.values("score")
