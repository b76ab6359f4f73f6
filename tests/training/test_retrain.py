"""Training a registered model's own graph (`mxq train --from NAME[:VERSION]`), and the
preprocessing a training sees (`--scale/--mean/--std/--layout`, else the model's stored one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
import pytest

from mxq.db import registry
from mxq.db.outputs import predictions
from mxq.db.records import ModelRecord
from mxq.preprocess import Preprocess
from mxq.tasks.model_store.models import trainable
from mxq.tasks.model_store.mxnet.versions import TrainedVersion, add_exported, add_trained
from mxq.tasks.training import datasets
from mxq.tasks.training.registration import rejudge
from mxq.tasks.training.train_loop import fit, make_trainer, source_net
from mxq.tasks.training.training_data import load_data
from mxq.workers.jobs.jobspecs import ParamsError, TrainParams, validate
from mxq.workers.settings import Settings
from tests.conftest import Stack

DIGITS = (1, 8, 8)


def own_cnn(*tail: mx.gluon.HybridBlock) -> mx.gluon.HybridBlock:
    """A user's own CNN for the digits (none of mxq's built-ins): conv, BatchNorm, dropout."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(16, 3, padding=1), mx.gluon.nn.BatchNorm(),
            mx.gluon.nn.Activation("relu"), mx.gluon.nn.MaxPool2D(2), mx.gluon.nn.Flatten(),
            mx.gluon.nn.Dropout(0.2), mx.gluon.nn.Dense(10), *tail)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    return net


def trained_and_exported(folder: Path, name: str, *tail: mx.gluon.HybridBlock) -> tuple[Path, Path]:
    """The user's net trained a little in plain MXNet on raw digits over 16, then exported."""
    mx.random.seed(5)
    net, digits = own_cnn(*tail), datasets.digits()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    loss = mx.gluon.loss.SoftmaxCrossEntropyLoss(from_logits=bool(tail))
    for i in range(0, 320, 32):
        x, y = mx.nd.array(digits.x[i:i + 32] / 16), mx.nd.array(digits.y[i:i + 32])
        with mx.autograd.record():
            out = net(x)
            value = loss(mx.nd.log(mx.nd.maximum(out, 1e-12)) if tail else out, y)
        value.backward()
        trainer.step(len(y))
    net.export(str(folder / name))
    return folder / f"{name}-symbol.json", folder / f"{name}-0000.params"


def plain(symbol: object, params: object, x: np.ndarray) -> np.ndarray:
    """The exported net's outputs (files as paths or recorded strings), run in plain MXNet."""
    net = mx.gluon.SymbolBlock.imports(str(symbol), ["data"], str(params))
    return net(mx.nd.array(x)).asnumpy()


def _register_own(store: Settings, folder: Path, name: str = "own", *tail: Any) -> ModelRecord:
    symbol, params = trained_and_exported(folder, name, *tail)
    return add_exported(store, name, symbol, params, DIGITS, Preprocess(scale=1 / 16))


def test_a_registered_graph_starts_from_its_weights_or_fresh_ones(store: Settings, tmp_path: Path) -> None:
    source = _register_own(store, tmp_path)
    x = datasets.digits().x[:64] / 16
    ctxs = [mx.cpu(0), mx.cpu(1)]
    kept = source_net(trainable(store, source, ctxs, "float32"),
                      TrainParams(from_model="own", dataset="digits"))
    expected = plain(source["symbol_file"], source["params_file"], x)
    for ctx in ctxs:  # the same weights on every device
        np.testing.assert_allclose(kept(mx.nd.array(x, ctx=ctx)).asnumpy(), expected, rtol=1e-5, atol=1e-5)
    fresh = source_net(trainable(store, source, ctxs, "float32"),
                       TrainParams(from_model="own", dataset="digits", reinit=True, seed=1))
    def role(end: str, net: Any = fresh) -> np.ndarray:  # (Gluon numbers blocks per process)
        return next(p for k, p in net.collect_params().items() if k.endswith(end)).data(ctxs[1]).asnumpy()

    assert not np.allclose(fresh(mx.nd.array(x)).asnumpy(), expected, atol=1e-3)
    assert np.all(role("_gamma") == 1) and np.all(role("_running_var") == 1)
    assert np.all(role("_running_mean") == 0) and np.all(role("_bias") == 0)
    again = source_net(trainable(store, source, ctxs, "float32"),
                       TrainParams(from_model="own", dataset="digits", reinit=True, seed=1))
    np.testing.assert_array_equal(role("_weight", again), role("_weight"))  # seeded


def test_the_trained_graph_registers_as_its_source_is(store: Settings, tmp_path: Path) -> None:
    """Same input shape, classes, outputs and preprocessing; the source named in its history;
    a net ending in a softmax trains on the log of its outputs and learns."""
    source = _register_own(store, tmp_path, "probs", mx.gluon.nn.HybridLambda(lambda F, x: F.softmax(x)))
    assert source["outputs"] == "probabilities"
    p = TrainParams(from_model="probs", dataset="digits", epochs=3, reinit=True, seed=2)
    ctxs = [mx.cpu(0), mx.cpu(1)]
    net = source_net(trainable(store, source, ctxs, "float32"), p)
    train, val = datasets.split(datasets.digits().for_training(), 0.2, 0)
    results = fit(p, train, val, ctxs, ["cpu:0", "cpu:1"], net, make_trainer(p, net, False),
                  outputs=source["outputs"])
    assert (results[-1]["val_accuracy"] or 0) >= 0.85, results  # from fresh weights (about 0.1)
    assert val is not None
    version = TrainedVersion(source["arch"], DIGITS, source["classes"],
                             Preprocess.from_dict(source["preprocess"]), source["outputs"], "probs:1")
    model = add_trained(store, "probs", net, version, {"val_accuracy": results[-1]["val_accuracy"]}, 12)
    def same(m: ModelRecord) -> tuple[object, ...]:
        return m["arch"], m["input_shape"], m["classes"], m["outputs"], m["preprocess"]

    assert same(model) == same(source)
    assert (model["version"], model["source"]) == (2, "train:job-12 from probs:1")
    x = val.x[:100]
    served = plain(model["symbol_file"], model["params_file"], x)
    np.testing.assert_allclose(served.sum(axis=1), 1, rtol=1e-4)  # still ends in its softmax
    assert np.mean(served.argmax(axis=1) == val.y[:100]) >= 0.85


@pytest.mark.parametrize(("params", "error"), [
    ({"dataset": "digits", "name": "x"},
     "give an architecture (mlp, lenet, resnet18_v1 or one of `mxq arch ls`) or --from NAME"),
    ({"arch": "mlp", "from_model": "own", "dataset": "digits"}, "one of them"),
    ({"arch": "mlp", "dataset": "digits"}, "name the model the training registers (--name NAME)"),
    ({"arch": "mlp", "dataset": "digits", "name": "x", "reinit": True},
     "--reinit and a :VERSION go with --from NAME"),
    ({"from_model": "own", "dataset": "digits", "scale": 0.5, "layout": "NHWC"},
     "--scale --layout: --from own trains with the preprocessing its version serves with"),
    ({"arch": "mlp", "dataset": "digits", "name": "x", "scale": 1e-40}, "--scale 1e-40: allowed"),
    ({"arch": "mlp", "dataset": "digits", "name": "x", "std": [0.0]}, "std.0=0.0"),
])
def test_a_training_names_one_source_and_sane_preprocessing(params: dict, error: str) -> None:
    with pytest.raises(ParamsError) as raised:
        validate("train", params)
    assert error in str(raised.value) and "\n" not in str(raised.value)


def test_a_training_from_a_model_registers_its_next_version_by_default() -> None:
    p = validate("train", {"from_model": "own", "from_version": 3, "dataset": "digits"})
    assert isinstance(p, TrainParams) and (p.name, p.from_version, p.arch) == ("own", 3, None)
    p = validate("train", {"arch": "mlp", "dataset": "digits", "name": "x", "scale": 0.25,
                           "mean": [0.5], "layout": "NCHW"})
    assert isinstance(p, TrainParams)
    assert p.preprocessing() == Preprocess(scale=0.25, mean=(0.5,), layout="NCHW")


def _cli_json(stack: Stack, *args: str) -> tuple[int, dict]:
    proc = stack.mxq(*args, "--json")
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {"stderr": proc.stderr}


def test_a_users_cnn_is_retrained_from_its_registered_graph_on_two_devices(workers: Stack) -> None:
    """Registered from its exported files, retrained from its promoted version on 2 devices, v2
    serves with 100 % agreement against the same network loaded in plain MXNet."""
    data = workers.home / "data"
    symbol, params = trained_and_exported(data, "usercnn")
    added = workers.mxq("models", "add", "usercnn", "--symbol", str(symbol), "--params", str(params),
                        "--input-shape", "1,8,8", "--scale", "1/16")
    assert added.returncode == 0, added.stderr
    code, job = _cli_json(workers, "train", "--from", "usercnn", "digits", "--devices", "2",
                          "--epochs", "3", "--seed", "4", "--wait")
    assert code == 0 and job["status"] == "succeeded", job
    assert sorted(job["devices"]) == ["cpu:0", "cpu:1"] and job["model_version"] == 2
    assert (job["params"]["from_model"], job["params"]["from_version"]) == ("usercnn", 1)
    assert job["epochs"][-1]["val_accuracy"] >= 0.9, job["epochs"]
    v1, v2 = workers.mxq_json("models", "usercnn")
    assert v2["source"] == f"train:job-{job['id']} from usercnn:1"
    for key in ("input_shape", "classes", "outputs", "preprocess"):
        assert v2[key] == v1[key], key
    digits = datasets.digits()
    np.save(data / "retrain-digits.npy", digits.x)
    served = workers.mxq_json("infer", "usercnn:2", "retrain-digits.npy", "--wait")
    assert served["status"] == "succeeded", served
    rows = predictions.read(workers.settings.database, served["id"])
    mine = plain(v2["symbol_file"], v2["params_file"], digits.x / 16).argmax(axis=1)
    assert [r["predicted_class"] for r in rows] == mine.tolist()  # 100 % agreement
    assert np.mean(mine == digits.y) >= 0.9


def test_a_training_from_a_model_refuses_data_it_cannot_take(workers: Stack, tmp_path: Path) -> None:
    symbol, params = trained_and_exported(workers.home / "data", "shapecnn")
    assert workers.mxq("models", "add", "shapecnn", "--symbol", str(symbol), "--params", str(params),
                       "--input-shape", "1,8,8").returncode == 0
    flat = datasets.digits()
    np.savez(workers.home / "data" / "flat.npz", X=flat.x.reshape(len(flat.y), 64), y=flat.y)
    code, job = _cli_json(workers, "train", "--from", "shapecnn", "flat.npz", "--wait")
    assert job["status"] == "failed"
    assert job["error"].endswith("flat.npz has samples of shape (64,) but shapecnn:1 takes (1, 8, 8)"), \
        job["error"]
    both = workers.mxq("train", "lenet", "digits", "--from", "shapecnn")
    assert both.returncode != 0 and "give DATASET alone, not an architecture" in both.stderr
    unknown = workers.mxq("train", "--from", "nosuch", "digits")
    assert unknown.returncode != 0 and "unknown model 'nosuch'" in unknown.stderr


@pytest.mark.slow  # long real-process work (seconds of real jobs): make test-all (CI) runs it
def test_a_retraining_sees_its_inputs_as_serving_does(workers: Stack) -> None:
    """Raw pixels (0..16) with --scale 1/16 register that scaling; a later training of the same
    model from the same raw file, with no options, trains with the stored one (not raw pixels,
    which once gave val_accuracy 0.084) and serves correctly."""
    digits = datasets.digits()
    np.savez(workers.home / "data" / "raw-digits.npz", X=digits.x, y=digits.y)
    code, first = _cli_json(workers, "train", "lenet", "raw-digits.npz", "--name", "raw-then-scaled",
                            "--scale", "1/16", "--epochs", "3", "--wait")
    assert code == 0 and first["status"] == "succeeded", first
    assert first["params"]["scale"] == 1 / 16
    code, second = _cli_json(workers, "train", "lenet", "raw-digits.npz", "--name", "raw-then-scaled",
                             "--epochs", "3", "--seed", "1", "--wait")
    assert code == 0 and second["status"] == "succeeded", second
    assert second["params"]["scale"] is None and second["epochs"][-1]["val_accuracy"] >= 0.9
    versions = workers.mxq_json("models", "raw-then-scaled")
    assert [v["preprocess"]["scale"] for v in versions] == [1 / 16, 1 / 16]
    code, queued = _cli_json(workers, "train", "lenet", "digits", "--name", "mean-two", "--mean", "1,2")
    assert code == 0, queued  # queued: the dataset's channels are the worker's to check
    job = workers.wait(queued["id"])
    assert job["status"] == "failed" and "--mean has 2 values; the input (1, 8, 8)" in str(job["error"])


def test_the_promoted_version_is_measured_again_on_the_trainings_validation_split(
        store: Settings, tmp_path: Path) -> None:
    """Fair `if-better`: the promoted version's registered figure (here a flattering 0.999)
    gives way to its accuracy on the same held-out samples the new version was judged on, its
    inputs scaled as it serves them."""
    symbol, params = trained_and_exported(tmp_path, "fair")
    source = add_exported(store, "fair", symbol, params, DIGITS, Preprocess(scale=1 / 16))
    registry.promote(store.database, "fair", 1)
    data = load_data(store, TrainParams(arch="lenet", dataset="digits", name="fair", seed=3))
    assert data.val_raw is not None and data.val is not None
    np.testing.assert_array_equal(data.val.x, data.val_raw.x / 16)  # the stored scaling, applied
    version, metrics = rejudge(store, TrainParams(arch="lenet", dataset="digits", name="fair"),
                               data, mx.cpu()) or (None, {})
    by_hand = plain(source["symbol_file"], source["params_file"], data.val_raw.x / 16).argmax(axis=1)
    assert version == 1 and metrics == {"val_accuracy": float(np.mean(by_hand == data.val_raw.y))}
    assert rejudge(store, TrainParams(arch="lenet", dataset="digits", name="other"), data, mx.cpu()) is None
