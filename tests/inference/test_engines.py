"""Two inference engines: every model version exported to ONNX and checked against MXNet at
registration, and jobs run by MXNet or ONNX Runtime as asked, or as measured faster (`auto`)."""

from __future__ import annotations

import json
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from mxq.db import registry
from mxq.db.migrate import upgrade
from mxq.db.outputs import predictions
from mxq.engines import MAX_DIFF
from mxq.tasks.model_store.mxnet.versions import add_builtin, add_exported
from mxq.tasks.runtimes import onnx_runtime
from mxq.workers.settings import Settings
from tests.conftest import Stack


@pytest.fixture
def store(tmp_path: Path) -> Settings:
    """A migrated SQLite database and a model store of its own, no workers."""
    s = Settings(home=tmp_path)
    upgrade(s.database)
    return s


@pytest.mark.parametrize(("arch", "shape"), [("mlp", (64,)), ("lenet", (1, 28, 28)),
                                             ("resnet18_v1", (3, 32, 32))])
def test_each_builtin_architecture_is_exported_and_agrees(store: Settings, arch: str,
                                                          shape: tuple[int, ...]) -> None:
    model = add_builtin(store, arch, arch, shape, 10, seed=3)
    onnx = model["onnx"]
    assert onnx is not None
    assert Path(onnx["file"]).is_file() and Path(onnx["file"]).parent == Path(model["params_file"]).parent
    assert onnx["max_diff"] <= MAX_DIFF and onnx["argmax_agreement"] == 1.0
    import onnx as onnx_lib

    graph = onnx_lib.load(onnx["file"]).graph
    weights = {i.name for i in graph.initializer}
    assert [i.name for i in graph.input if i.name in weights] == []  # constants can be folded
    assert [o.name for o in graph.output] == ["probabilities"]


def _user_model(folder: Path, layers: list, width: int = 12) -> tuple[Path, Path]:
    net = mx.gluon.nn.HybridSequential()
    net.add(*layers)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, width)))
    net.export(str(folder / "user"))
    return folder / "user-symbol.json", folder / "user-0000.params"


def test_a_users_exported_model_is_exported_too(store: Settings, tmp_path: Path) -> None:
    symbol, params = _user_model(tmp_path, [mx.gluon.nn.Dense(16, activation="tanh"), mx.gluon.nn.Dense(5)])
    model = add_exported(store, "user", symbol, params, (12,))
    assert model["onnx"] is not None
    assert model["onnx"]["file"] and model["onnx"]["argmax_agreement"] == 1.0
    assert model["onnx"]["max_diff"] <= MAX_DIFF


def _refused_symbol(folder: Path) -> tuple[Path, Path]:
    """A model with an op (erfinv) MXNet's ONNX exporter has no conversion for."""
    data = mx.sym.var("data")
    net = mx.gluon.SymbolBlock(mx.sym.FullyConnected(mx.sym.erfinv(data * 0.1), num_hidden=4), [data])
    net.initialize()
    net(mx.nd.ones((1, 8)))
    net.export(str(folder / "odd"))
    return folder / "odd-symbol.json", folder / "odd-0000.params"


def test_a_model_the_exporter_refuses_is_registered_with_the_reason(store: Settings,
                                                                    tmp_path: Path) -> None:
    symbol, params = _refused_symbol(tmp_path)
    model = add_exported(store, "odd", symbol, params, (8,))
    assert model["onnx"] is not None
    assert model["onnx"]["file"] is None
    assert "cannot convert" in model["onnx"]["error"] and "erfinv" in model["onnx"]["error"]
    assert not list(Path(model["params_file"]).parent.glob("*.onnx"))


def test_a_forgotten_onnx_session_goes_with_its_last_job(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """After running out of memory the job forgets its session (`Engine.release`): ONNX
    Runtime's CPU arena keeps every chunk a session got (here a 256 MiB intermediate: a batch of
    1,024 rows tiled 64 times) until the session goes. The job computes on with it; once the job
    drops it nothing holds it, and the next job loads a new one that computes the same."""
    import gc
    import weakref

    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Tile", ["x", "reps"], ["wide"]),
         helper.make_node("ReduceMean", ["wide"], ["y"], axes=[1], keepdims=0)], "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor("reps", TensorProto.INT64, [2], [1, 64])])
    path = tmp_path / "wide.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    monkeypatch.setattr(onnx_runtime, "_sessions", type(onnx_runtime._sessions)())
    sess, _ = onnx_runtime.session(path)
    forward = onnx_runtime.runner(sess)
    x = np.random.default_rng(0).random((1024, 1024), dtype=np.float32)
    expected = forward(x)
    np.testing.assert_allclose(expected, x.mean(axis=1), rtol=1e-5)
    onnx_runtime.forget(path)
    np.testing.assert_allclose(forward(x[:4]), expected[:4], rtol=1e-6)  # the job goes on
    old = weakref.ref(sess)
    del sess, forward  # the job ends
    gc.collect()
    assert old() is None and not onnx_runtime._sessions
    again, cached = onnx_runtime.session(path)
    assert not cached
    np.testing.assert_allclose(onnx_runtime.run(again, x[:4]), expected[:4], rtol=1e-6)


def test_onnx_runtime_threads_follow_the_workers_cores(tmp_path: Path, store: Settings,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    model = add_builtin(store, "m", "mlp", (8,), 3)
    assert model["onnx"] is not None
    monkeypatch.setattr(onnx_runtime, "_sessions", type(onnx_runtime._sessions)())
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # what pinning sets for a 3-core slice
    assert onnx_runtime.threads() == 3
    sess, cached = onnx_runtime.session(Path(model["onnx"]["file"]))
    options = sess.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads, cached) == (3, 1, False)
    assert onnx_runtime.session(Path(model["onnx"]["file"]))[1] is True
    monkeypatch.delenv("OMP_NUM_THREADS")
    import os

    assert onnx_runtime.threads() == len(os.sched_getaffinity(0))


# Through real workers: the engine a job ran on is in its result.

def _data(stack: Stack, name: str, x: np.ndarray) -> str:
    np.save(stack.home / "data" / name, x)
    return name


def _infer(stack: Stack, *args: str) -> dict:
    proc = stack.mxq("infer", *args, "--wait", "--json")
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def _add(stack: Stack, name: str) -> dict:
    proc = stack.mxq("models", "add", name, "--arch", "mlp", "--input-shape", "32", "--classes", "6",
                     "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _direct(stack: Stack, name: str, x: np.ndarray) -> np.ndarray:
    from mxq.tasks.model_store.models import load

    net, _ = load(stack.settings, registry.resolve(stack.settings.database, name), mx.cpu())
    return mx.nd.softmax(net(mx.nd.array(x))).asnumpy()


def test_each_engine_as_asked_gives_mxnets_predictions(workers: Stack) -> None:
    _add(workers, "both")
    x = np.random.default_rng(4).normal(size=(3000, 32)).astype(np.float32)
    name = _data(workers, "both.npy", x)
    expected = _direct(workers, "both", x)
    for engine in ("onnx", "mxnet"):
        job = _infer(workers, "both", name, "--engine", engine, "--batch-size", "500", "--top-k", "2")
        assert job["status"] == "succeeded", job["error"]
        assert (job["result"]["engine"], job["result"]["engine_reason"]) == (engine, "asked")
        rows = predictions.read(workers.settings.database, job["id"])
        assert [r["predicted_class"] for r in rows] == expected.argmax(axis=1).tolist()
        np.testing.assert_allclose([r["score"] for r in rows], expected.max(axis=1), atol=MAX_DIFF)


@pytest.mark.parametrize("faster", ["mxnet", "onnx"])
def test_auto_runs_the_engine_measured_faster(workers: Stack, faster: str) -> None:
    name = f"fast-{faster}"
    _add(workers, name)
    slower = {"mxnet": "onnx", "onnx": "mxnet"}[faster]
    registry.record_engine_speeds(workers.settings.database, name, 1, "cpu", {faster: 9000.0, slower: 100.0})
    job = _infer(workers, name, _data(workers, "auto.npy", np.ones((40, 32), np.float32)))
    assert job["status"] == "succeeded", job["error"]
    assert job["result"]["engine"] == faster
    assert "measured faster" in job["result"]["engine_reason"]


def test_auto_measures_both_engines_once_per_device_kind(workers: Stack) -> None:
    _add(workers, "fresh")
    name = _data(workers, "fresh.npy", np.ones((100, 32), np.float32))  # streamed, not merged
    first = _infer(workers, "fresh", name, "--device", "cpu:0")
    assert first["status"] == "succeeded", first["error"]
    shown = json.loads(workers.mxq("models", "fresh", "--json").stdout)
    speeds = shown[0]["engines"]["cpu"]
    assert speeds["mxnet"] > 0 and speeds["onnx"] > 0
    assert first["result"]["engine"] == max(speeds, key=speeds.get)
    assert shown[0]["auto_engine"]["cpu"] == {"engine": first["result"]["engine"],
                                              "reason": first["result"]["engine_reason"]}
    again = _infer(workers, "fresh", name, "--device", "cpu:1")
    assert again["result"]["engine"] == first["result"]["engine"]
    assert json.loads(workers.mxq("models", "fresh", "--json").stdout)[0]["engines"]["cpu"] == speeds
    # the measuring is the first job's fixed cost, apart from its model's load; not the second's
    costs = [j["result"]["fixed_costs"] for j in (first, again)]
    assert costs[0]["engine_measure"] > 0 and costs[1]["engine_measure"] == 0
    assert all(c["claim_to_first_batch"] >= c["model_load"] + c["engine_measure"] for c in costs)


def test_a_model_without_an_export_serves_with_mxnet(workers: Stack, tmp_path: Path) -> None:
    symbol, params = _refused_symbol(tmp_path)
    added = workers.mxq("models", "add", "odd", "--symbol", str(symbol), "--params", str(params),
                        "--input-shape", "8", "--json")
    assert added.returncode == 0, added.stderr
    name = _data(workers, "odd.npy", np.ones((20, 8), np.float32))
    job = _infer(workers, "odd", name)
    assert job["status"] == "succeeded", job["error"]
    assert job["result"]["engine"] == "mxnet" and "no ONNX export" in job["result"]["engine_reason"]
    forced = _infer(workers, "odd", name, "--engine", "onnx")
    assert forced["status"] == "failed"
    assert "has no ONNX export" in forced["error"] and "--engine mxnet" in forced["error"]


def test_auto_serves_with_mxnet_when_the_onnx_side_cannot_be_measured(workers: Stack) -> None:
    model = _add(workers, "lost-onnx")
    Path(model["onnx"]["file"]).unlink()  # the store lost the export after registration
    job = _infer(workers, "lost-onnx", _data(workers, "lost.npy", np.ones((30, 32), np.float32)))
    assert job["status"] == "succeeded", job["error"]
    assert job["result"]["engine"] == "mxnet"
    assert job["result"]["engine_reason"].startswith("not measured: ONNX file ")
    forced = _infer(workers, "lost-onnx", "lost.npy", "--engine", "onnx")
    assert forced["status"] == "failed" and "is missing" in forced["error"]
