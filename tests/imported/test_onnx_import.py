"""`mxq models add NAME --onnx FILE.onnx`: an ONNX file built without MXNet (`onnx.helper`, as
PyTorch's or skl2onnx's exporters write them) is registered, served by ONNX Runtime with the
predictions of ONNX Runtime run by hand, and refused in one line where it cannot go: MXNet, a
training from it, and files mxq cannot serve."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mxq.tasks.model_store.model_error import ModelError
from mxq.tasks.model_store.onnx_import import add_onnx
from mxq.workers.settings import Settings
from tests.conftest import ROOT, Stack

SIZES = (64, 16, 10)  # an MLP 64 -> 16 -> 10


def _weights(seed: int) -> list[onnx.TensorProto]:
    rng = np.random.default_rng(seed)
    (n_in, hidden, classes) = SIZES
    arrays = {"w1": rng.standard_normal((n_in, hidden)) * 0.3, "b1": rng.standard_normal(hidden),
              "w2": rng.standard_normal((hidden, classes)) * 0.3, "b2": rng.standard_normal(classes)}
    return [numpy_helper.from_array(a.astype(np.float32), name) for name, a in arrays.items()]


def mlp(path: Path, softmax: bool = False, batch: str | int = "N", output: str = "scores",
        seed: int = 7, out_shape: list[Any] | None = None) -> Path:
    """A small MLP in plain ONNX (Gemm, Relu, Gemm, and a Softmax when `softmax`), fixed
    seeded weights, saved to `path`."""
    last = "logits" if softmax else output
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], [last])]
    if softmax:
        nodes.append(helper.make_node("Softmax", ["logits"], [output], axis=1))
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, SIZES[0]])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, out_shape or [batch, SIZES[2]])],
        _weights(seed))
    _save(graph, path)
    return path


def _save(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def by_hand(path: Path, x: np.ndarray, logits: bool) -> np.ndarray:
    """ONNX Runtime on the user's file, no mxq: a softmax applied by hand to logits."""
    out = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    if logits:
        e = np.exp(out - out.max(axis=1, keepdims=True))
        out = e / e.sum(axis=1, keepdims=True)
    return np.asarray(out, np.float32)


def _added(stack: Stack, name: str, path: Path, *args: str) -> dict[str, Any]:
    proc = stack.mxq("models", "add", name, "--onnx", str(path), *args, "--json")
    assert proc.returncode == 0, proc.stderr
    record: dict[str, Any] = json.loads(proc.stdout)
    return record


def _one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


@pytest.mark.parametrize("softmax", [False, True], ids=["logits", "probabilities"])
def test_a_plain_onnx_file_serves_what_onnx_runtime_gives_by_hand(workers: Stack, tmp_path: Path,
                                                                   softmax: bool) -> None:
    name = f"onnximp-{'probs' if softmax else 'logits'}"
    path = mlp(tmp_path / "mine.onnx", softmax=softmax)
    record = _added(workers, name, path)
    assert (record["arch"], record["input_shape"], record["classes"], record["symbol_file"]) == \
        ("onnx", [64], 10, None)
    assert record["outputs"] == ("probabilities" if softmax else "logits")
    onnx_record = record["onnx"]
    assert onnx_record["imported"] and Path(onnx_record["file"]).is_file()
    assert onnx_record["max_diff"] <= 1e-5 and onnx_record["argmax_agreement"] == 1.0
    assert Path(record["params_file"]).read_bytes() == path.read_bytes()  # the file as given
    x = np.random.default_rng(3).standard_normal((700, 64)).astype(np.float32)
    np.save(workers.home / "data" / f"{name}.npy", x)
    job = workers.mxq_json("infer", name, f"{name}.npy", "--output", "npy", "--batch-size", "128",
                           "--wait")
    assert job["status"] == "succeeded", job["error"]
    assert job["result"]["engine"] == "onnx" and "plain ONNX" in job["result"]["engine_reason"]
    np.testing.assert_allclose(np.load(job["output"]), by_hand(path, x, logits=not softmax), atol=1e-5)
    shown = workers.mxq_json("models", name)[0]
    assert "mxnet" not in (shown["engines"].get("cpu") or {})  # auto never measured MXNet


def test_a_plain_onnx_embedding_and_regression_serve_their_values(workers: Stack, tmp_path: Path) -> None:
    """A graph whose 10 outputs are an embedding (stated), and one of width 1 (auto: regression),
    stored as values in Parquet, equal to ONNX Runtime by hand."""
    emb = mlp(tmp_path / "emb.onnx", seed=11)
    record = _added(workers, "onnximp-emb", emb, "--outputs", "embedding")
    assert (record["outputs"], record["classes"]) == ("embedding", 10)
    assert "cosine" in record["onnx"]["measure"] and record["onnx"]["argmax_agreement"] == 1.0
    x = np.random.default_rng(5).standard_normal((900, 64)).astype(np.float32)
    np.save(workers.home / "data" / "onnximp-emb.npy", x)
    job = workers.mxq_json("infer", "onnximp-emb", "onnximp-emb.npy", "--output", "parquet", "--wait")
    assert job["status"] == "succeeded", job["error"]
    import pyarrow.parquet as pq
    stored = np.stack(pq.read_table(job["output"]).column("output").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(stored, by_hand(emb, x, logits=False), atol=1e-5)

    rng = np.random.default_rng(2)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["value"])], "reg",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("value", TensorProto.FLOAT, ["N", 1])],
        [numpy_helper.from_array(rng.standard_normal((64, 1)).astype(np.float32), "w"),
         numpy_helper.from_array(np.array([0.5], np.float32), "b")])
    _save(graph, tmp_path / "reg.onnx")
    record = _added(workers, "onnximp-reg", tmp_path / "reg.onnx")
    assert (record["outputs"], record["classes"]) == ("regression", 1)


def test_mxnet_and_a_training_from_it_are_refused_in_one_line(workers: Stack, tmp_path: Path) -> None:
    _added(workers, "onnximp-refused", mlp(tmp_path / "r.onnx"))
    np.save(workers.home / "data" / "onnximp-refused.npy", np.ones((4, 64), np.float32))
    asked = workers.mxq("infer", "onnximp-refused", "onnximp-refused.npy", "--engine", "mxnet")
    _one_line_error(asked, "model onnximp-refused:1 is a plain ONNX file: it runs on ONNX Runtime "
                    "only; use --engine onnx or auto")
    train = workers.mxq("train", "--from", "onnximp-refused", "digits")
    _one_line_error(train, "--from onnximp-refused:1", "no MXNet graph", "a plain ONNX file")
    onnx_asked = workers.mxq_json("infer", "onnximp-refused", "onnximp-refused.npy", "--engine", "onnx",
                                  "--wait")
    assert onnx_asked["status"] == "succeeded", onnx_asked["error"]


def test_onnx_goes_alone_in_one_line(workers: Stack, tmp_path: Path) -> None:
    path = mlp(tmp_path / "alone.onnx")
    both = workers.mxq("models", "add", "onnximp-alone", "--onnx", str(path), "--arch", "mlp",
                       "--input-shape", "64")
    _one_line_error(both, "--onnx goes alone")


WITHOUT_MXNET = ("import sys; sys.modules['mxnet'] = None; sys.argv[0] = 'mxq'; "
                 "from mxq.cli.main import main; main()")


def test_a_process_without_mxnet_has_a_worker_register_it(workers: Stack, tmp_path: Path) -> None:
    path = mlp(tmp_path / "staged.onnx", softmax=True)
    proc = subprocess.run([sys.executable, "-c", WITHOUT_MXNET, "models", "add", "onnximp-staged",
                           "--onnx", str(path), "--json"], cwd=ROOT, capture_output=True, text=True,
                          env=workers.environ(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert (record["arch"], record["outputs"], record["classes"]) == ("onnx", "probabilities", 10)
    assert list((workers.home / "staging").iterdir()) == []


# Registration alone, on a store of its own: what the graph says, and what mxq refuses.

def _two_inputs(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])], "two",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    _save(graph, path)
    return path


def _rank_one(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)], "flat",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])])
    _save(graph, path)
    return path


def _one_node(path: Path, node: onnx.NodeProto | list[onnx.NodeProto], opsets: dict[str, int],
              outputs: list[onnx.ValueInfoProto] | None = None) -> Path:
    graph = helper.make_graph(node if isinstance(node, list) else [node], "one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              outputs or [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _unknown_op(path: Path) -> Path:
    return _one_node(path, helper.make_node("Frobnicate", ["x"], ["y"], domain="my.ops"),
                     {"": 17, "my.ops": 1})


def _two_probabilities(path: Path) -> Path:
    """Two float outputs: which one mxq should serve is not for it to guess (a label beside
    probabilities, as converters write a classifier, is tests/imported/test_exporters.py's)."""
    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=1),
             helper.make_node("Softmax", ["x"], ["q"], axis=0)]
    return _one_node(path, nodes, {"": 17},
                     [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 4]),
                      helper.make_tensor_value_info("q", TensorProto.FLOAT, ["N", 4])])


def _endless_loop(path: Path) -> Path:
    """A Loop of 2^62 turns around an Identity: a trial that would never end."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["v_in"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, ["N", 4])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trip", "cond", "x"], ["y"], body=body)], "endless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        initializer=[helper.make_tensor("trip", TensorProto.INT64, [], [2**62]),
                     helper.make_tensor("cond", TensorProto.BOOL, [], [True])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_an_endless_graph_is_stopped_and_refused_in_one_line(store: Settings, tmp_path: Path,
                                                             capfd: pytest.CaptureFixture[str]) -> None:
    """Issue 58: `mxq models add` of a Loop of 2^62 turns hung for good. The trial stops at
    MXQ_MODEL_TRIAL_SECONDS, the refusal is one line, and ONNX Runtime prints nothing of its own
    (its coloured error line came before mxq's)."""
    bounded = store.model_copy(update={"model_trial_seconds": 1.0})
    with pytest.raises(ModelError) as refused:
        add_onnx(bounded, "endless", _endless_loop(tmp_path / "endless.onnx"), None)
    assert str(refused.value).startswith("endless.onnx ran for more than 1 s on a batch of 1 samples "
                                         "and was stopped (MXQ_MODEL_TRIAL_SECONDS)")
    assert "onnxruntime" not in capfd.readouterr().err


def _not_onnx(path: Path) -> Path:
    path.write_bytes(b"\x00not an onnx model at all\xff" * 10)
    return path


@pytest.mark.parametrize(("make", "words"), [
    (_not_onnx, "bad.onnx is not a valid ONNX model: "),
    (_two_inputs, "bad.onnx has 2 inputs (a, b); mxq serves models with exactly one input"),
    (_rank_one, "bad.onnx: output y has rank 1; mxq needs (batch, classes)"),
    (lambda p: mlp(p, batch=4), "bad.onnx: input x fixes the batch to 4"),
    (lambda p: mlp(p, out_shape=["N", 10, 1]), "bad.onnx: output scores has rank 3"),
    (_unknown_op, "ONNX Runtime cannot load bad.onnx: "),
    (_two_probabilities, "bad.onnx has 2 outputs (p, q); mxq needs exactly one"),
], ids=["not-onnx", "two-inputs", "rank-1-output", "fixed-batch", "rank-3-output", "unknown-op",
        "two-outputs"])
def test_a_file_mxq_cannot_serve_is_refused_in_one_line(store: Settings, tmp_path: Path, make: Any,
                                                        words: str) -> None:
    with pytest.raises(ModelError) as refused:
        add_onnx(store, "bad", make(tmp_path / "bad.onnx"), None)
    assert words in str(refused.value) and "\n" not in str(refused.value)
    assert not (store.home_path / "models").exists() or not any((store.home_path / "models").rglob("*.onnx"))


def test_the_input_shape_is_read_or_given_and_a_mismatch_refused(store: Settings, tmp_path: Path) -> None:
    path = mlp(tmp_path / "m.onnx")
    assert add_onnx(store, "given", path, (64,))["input_shape"] == [64]
    with pytest.raises(ModelError, match=r"--input-shape 8,8: m.onnx takes one sample of shape \(64\)"):
        add_onnx(store, "given", path, (8, 8))


def test_a_batch_fixed_to_one_serves_any_batch_and_an_output_named_probabilities(
        store: Settings, tmp_path: Path) -> None:
    """As `torch.onnx.export` writes without dynamic_axes; the output's name is the served one's."""
    path = mlp(tmp_path / "one.onnx", batch=1, output="probabilities")
    record = add_onnx(store, "fixed-one", path, None)
    assert record["onnx"] is not None and record["outputs"] == "logits"
    x = np.random.default_rng(5).standard_normal((7, 64)).astype(np.float32)
    served = ort.InferenceSession(record["onnx"]["file"], providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(served.run(None, {"x": x})[0], _rows_by_hand(path, x), atol=1e-5)


def _rows_by_hand(path: Path, x: np.ndarray) -> np.ndarray:
    """The batch-1 file run one sample at a time (it takes no other batch), softmax by hand."""
    return np.concatenate([by_hand(path, x[i:i + 1], logits=True) for i in range(len(x))])


def test_stated_outputs_that_contradict_the_model_are_refused(store: Settings, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="--outputs logits: the model outputs probabilities"):
        add_onnx(store, "said", mlp(tmp_path / "p.onnx", softmax=True), None, outputs="logits")
    with pytest.raises(ModelError, match="--outputs probabilities: the model's outputs on 3 random"):
        add_onnx(store, "said", mlp(tmp_path / "l.onnx"), None, outputs="probabilities")


def test_its_variants_are_built_from_the_stored_graph(store: Settings, tmp_path: Path) -> None:
    from mxq.tasks.model_store.variants import build_variant, calibration_from

    record = add_onnx(store, "quant", mlp(tmp_path / "q.onnx"), None)
    x = np.random.default_rng(2).standard_normal((400, 64)).astype(np.float32)
    for precision in ("int8", "fp16"):
        record = build_variant(store, record, precision, calibration_from(x, None, "x.npy", record))
        assert record["variants"][precision]["agreement"] >= 0.9


def test_the_engine_rules_send_a_plain_onnx_version_to_onnx_runtime() -> None:
    from mxq.engines import Choice, NoEngine, choose, engine_problem, needed, needs_measuring

    plain = {"file": "model.onnx", "sha256": "0" * 64, "max_diff": 0.0, "argmax_agreement": 1.0,
             "imported": True}
    assert needed("infer", "auto", plain) == "onnx" and needed("infer", None, plain) == "onnx"
    assert not needs_measuring("auto", plain, None)  # nothing to measure it against
    assert choose("auto", plain, None) == Choice("onnx", "a plain ONNX file: ONNX Runtime only")
    assert choose("auto", plain, None, "no CUDA for MXNet").engine == "onnx"
    assert choose("onnx", plain, None) == Choice("onnx", "asked")
    with pytest.raises(NoEngine, match="plain ONNX file"):
        choose("mxnet", plain, None)
    assert engine_problem("mxnet", plain, "m:2") == ("model m:2 is a plain ONNX file: it runs on ONNX "
                                                     "Runtime only; use --engine onnx or auto")
    assert engine_problem("auto", plain, "m:2") is None
    assert engine_problem("mxnet", {"file": "x"}, "m:1") is None


def test_a_graph_of_ai_onnx_ml_ops_alone_gets_the_softmax_it_is_served_with(store: Settings,
                                                                           tmp_path: Path) -> None:
    path = _one_node(tmp_path / "ml.onnx", helper.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml",
                                                            norm="L1"), {"ai.onnx.ml": 1})
    record = add_onnx(store, "mlonly", path, None)
    assert (record["outputs"], record["classes"]) == ("logits", 4) and record["onnx"] is not None
    x = np.random.default_rng(6).standard_normal((5, 4)).astype(np.float32)
    served = ort.InferenceSession(record["onnx"]["file"], providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(served.run(None, {"x": x})[0], by_hand(path, x, logits=True), atol=1e-6)


def test_its_int8_variant_serves_a_job_through_the_cli(workers: Stack, tmp_path: Path) -> None:
    _added(workers, "onnximp-int8", mlp(tmp_path / "q.onnx"))
    x = np.random.default_rng(8).standard_normal((300, 64)).astype(np.float32)
    np.save(workers.home / "data" / "onnximp-int8.npy", x)
    built = workers.mxq("models", "quantize", "onnximp-int8", "--calibration", "onnximp-int8.npy")
    assert built.returncode == 0, built.stderr
    job = workers.mxq_json("infer", "onnximp-int8", "onnximp-int8.npy", "--precision", "int8", "--wait")
    assert job["status"] == "succeeded", job["error"]
    assert (job["result"]["engine"], job["result"]["precision"]) == ("onnx", "int8")
