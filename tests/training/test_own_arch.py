"""Your own architecture's code (`mxq arch add NAME FILE.py --factory FUNC`) through real workers:
registered after a trial forward in a worker's child process, trained by name as the built-ins
are (the same accuracy as the same net in a plain MXNet Gluon data-parallel loop), its print()
in the job's log, its checksum recorded on the version; bad code refused in one line; only an
admin registers code through the API."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from mxq.api import routes
from mxq.api.app import app
from mxq.db.sharing import users
from mxq.tasks.training import datasets
from tests.conftest import Stack

ADMIN_TOKEN = "arch-admin-token-0123"

# A user's small CNN for the digits (1,8,8), none of mxq's built-ins, printing from its factory.
MY_NET = '''
from mxnet import gluon


def build_net(classes, input_shape):
    print("building my net")
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(16, 3, padding=1, activation="relu"), gluon.nn.MaxPool2D(2),
            gluon.nn.Conv2D(32, 3, padding=1, activation="relu"), gluon.nn.Flatten(),
            gluon.nn.Dense(64, activation="relu"), gluon.nn.Dense(classes))
    return net
'''
EPOCHS, BATCH, LR, SEED = 5, 64, 0.1, 0


def _factory(code: str) -> Callable[[int, tuple[int, ...]], Any]:
    scope: dict[str, Any] = {}
    exec(compile(code, "my_net.py", "exec"), scope)
    return scope["build_net"]


def plain_gluon_accuracy(code: str, devices: int) -> float:
    """The same net trained by a plain MXNet Gluon data-parallel loop (MXNet's multi-device
    guide) on mxq's own split, epochs, batch size, learning rate, seed and shuffles: its final
    validation accuracy."""
    train, val = datasets.split(datasets.digits().for_training(), 0.2, SEED)
    assert val is not None
    ctxs = [mx.cpu(i) for i in range(devices)]
    net = _factory(code)(10, (1, 8, 8))
    mx.random.seed(SEED)
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    net.hybridize()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": 0.9},
                               kvstore="local")
    loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for epoch in range(1, EPOCHS + 1):
        order = np.random.default_rng(SEED + epoch).permutation(len(train.y))  # mxq's per-epoch order
        for i in range(0, len(order), BATCH):
            idx = order[i:i + BATCH]
            xs = mx.gluon.utils.split_and_load(mx.nd.array(train.x[idx]), ctxs, even_split=False)
            ys = mx.gluon.utils.split_and_load(mx.nd.array(train.y[idx]), ctxs, even_split=False)
            with mx.autograd.record():
                losses = [loss(net(x), y) for x, y in zip(xs, ys, strict=True)]
            for value in losses:
                value.backward()
            trainer.step(len(idx))
    predicted = net(mx.nd.array(val.x, ctx=ctxs[0])).argmax(axis=1).asnumpy().astype(np.int32)
    return float(np.mean(predicted == val.y))


def _add(stack: Stack, tmp_path: Path, name: str, code: str, *options: str) -> Any:
    path = tmp_path / f"{name}.py"
    path.write_text(code)
    return stack.mxq("arch", "add", name, str(path), "--factory", "build_net", "--input-shape", "1,8,8",
                     *options, "--json")


def test_your_own_architecture_trains_by_name_as_a_plain_gluon_loop_does(workers: Stack,
                                                                          tmp_path: Path) -> None:
    added = _add(workers, tmp_path, "mynet", MY_NET)
    assert added.returncode == 0, added.stderr
    arch = json.loads(added.stdout)
    sha256 = hashlib.sha256(MY_NET.encode()).hexdigest()
    assert (arch["name"], arch["version"], arch["sha256"], arch["factory"]) == \
        ("mynet", 1, sha256, "build_net")
    assert any(a["name"] == "mynet" for a in workers.mxq_json("arch", "ls"))
    stored = workers.home / "models"
    assert [p.read_text() for p in stored.glob(f"*/.archs/{sha256}.py")] == [MY_NET]

    proc = workers.mxq("train", "mynet", "digits", "--name", "own-arch-digits", "--devices", "2", "--epochs",
                       str(EPOCHS), "--wait", "--json")
    job = json.loads(proc.stdout)
    assert proc.returncode == 0 and job["status"] == "succeeded", job.get("error") or proc.stderr
    assert job["params"]["arch"] == "mynet" and job["params"]["arch_sha256"] == sha256
    assert sorted(job["devices"]) == ["cpu:0", "cpu:1"]
    val_accuracy = job["epochs"][-1]["val_accuracy"]
    plain = plain_gluon_accuracy(MY_NET, 2)
    assert abs(val_accuracy - plain) <= 0.01, (val_accuracy, plain)
    assert val_accuracy >= 0.9

    version = workers.mxq_json("models", "own-arch-digits")[-1]
    assert version["arch"] == "mynet"
    assert version["source"] == f"train:job-{job['id']} arch mynet@{sha256}"
    logs = workers.mxq("logs", str(job["id"]))
    assert logs.returncode == 0 and "building my net" in logs.stdout, logs.stdout


@pytest.mark.slow  # a trial job per case on a worker: make test-all (CI) runs it
@pytest.mark.parametrize(("code", "line"), [
    (MY_NET.replace('print("building my net")', 'raise ValueError("no such layer")'),
     r"^arch {name}: factory build_net raised ValueError: no such layer$"),
    (MY_NET.replace("    return net", "    return None"),
     r"^arch {name}: factory build_net returned NoneType, not a gluon HybridBlock$"),
    (MY_NET.replace("    return net", "    return [net]"),
     r"^arch {name}: factory build_net returned list, not a gluon HybridBlock$"),
    (MY_NET.replace("gluon.nn.Dense(classes)", "gluon.nn.Dense(7)"),
     r"^arch {name}: output shape \(4, 7\) does not match 10 classes"),
    (MY_NET.replace("def build_net(classes, input_shape):", "def build_net(classes, input_shape)"),
     r"^arch {name}: importing {name}.py raised SyntaxError: "),
    (MY_NET.replace("def build_net(", "def other_net("),
     r"^arch {name}: {name}.py has no function build_net$"),
])
def test_bad_code_is_refused_in_one_line_and_nothing_is_registered(workers: Stack, tmp_path: Path,
                                                                   code: str, line: str) -> None:
    name = f"bad{abs(hash(code)) % 10**8}"
    proc = _add(workers, tmp_path, name, code)
    assert proc.returncode != 0
    error = proc.stderr.strip().removeprefix("mxq: error: ")
    assert "\n" not in error and re.search(line.format(name=name), error), proc.stderr
    assert all(a["name"] != name for a in workers.mxq_json("arch", "ls"))
    refused = workers.mxq("train", name, "digits", "--name", "x", "--json")
    assert refused.returncode != 0 and f"unknown architecture '{name}'" in refused.stdout + refused.stderr


@pytest.mark.slow  # a trial and a training on a worker: make test-all (CI) runs it
def test_code_that_breaks_at_training_fails_the_job_in_one_line(workers: Stack, tmp_path: Path) -> None:
    """Registered for 10 classes, trained on a dataset of 3: the net's output does not fit."""
    assert _add(workers, tmp_path, "tenonly", MY_NET.replace("gluon.nn.Dense(classes)", "gluon.nn.Dense(10)"),
                ).returncode == 0
    x, y = datasets.digits().x, datasets.digits().y
    keep = y < 3
    np.savez(workers.home / "data" / "three.npz", X=x[keep].reshape(-1, 1, 8, 8), y=y[keep])
    proc = workers.mxq("train", "tenonly", "three.npz", "--name", "three", "--epochs", "1", "--wait",
                       "--json")
    job = json.loads(proc.stdout)
    assert job["status"] == "failed"
    assert job["error"] == "arch tenonly: output shape (4, 10) does not match 3 classes (expected " \
        "(4, 3) for a batch of (4, 1, 8, 8))", job["error"]


def test_only_an_admin_registers_code_through_the_api(workers: Stack) -> None:
    s = workers.settings.model_copy(update={"api_token": SecretStr(ADMIN_TOKEN)})
    app.dependency_overrides[routes.settings] = lambda: s
    submitter = "archsubmitter"
    try:
        token = workers.mxq_json("users", "add", submitter, "--role", "submit")["token"]
        client = TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000))
        body = {"name": "viaapi", "code": MY_NET, "file_name": "my_net.py", "factory": "build_net",
                "input_shape": [1, 8, 8]}
        refused = client.post("/api/v1/archs", json=body, headers={"Authorization": f"Bearer {token}"})
        assert refused.status_code == 403 and "needs role admin" in refused.json()["detail"]
        listed = client.get("/api/v1/archs", headers={"Authorization": f"Bearer {token}"})
        assert listed.status_code == 200 and all(a["name"] != "viaapi" for a in listed.json())
        gone = client.delete("/api/v1/archs/viaapi", headers={"Authorization": f"Bearer {token}"})
        assert gone.status_code == 403
        queued = client.post("/api/v1/archs", json=body,
                             headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert queued.status_code == 202, queued.text
        job = workers.wait(queued.json()["id"])
        result = job["result"]
        assert job["status"] == "succeeded" and result is not None, job["error"]
        assert result["arch"]["name"] == "viaapi" and job["owner"] == "admin"
        assert result["arch"]["added_by"] == "admin"
    finally:
        app.dependency_overrides.clear()
        users.remove(workers.settings.database, submitter)
