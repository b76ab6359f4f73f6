"""`mxq models add` from a process that cannot load MXNet (the compose `api` container: the GPU
build, no GPU, no driver; an ONNX-only install) is registered by a device worker as a `register`
job: the same checks, trial run, ONNX export and checksums. Here the process is a real `mxq` whose
`import mxnet` fails (Python's own block: None in sys.modules), against live CPU workers; the GPU
tier does it with the real GPU build and no driver (tests/hosts/test_gpu_install.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from mxq.db.registry import list_models
from tests.conftest import ROOT, Stack

WITHOUT_MXNET = ("import sys; sys.modules['mxnet'] = None; sys.argv[0] = 'mxq'; "
                 "from mxq.cli.main import main; main()")


def _add(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_MXNET, "models", "add", *args],
                          cwd=ROOT, capture_output=True, text=True, env=stack.environ(), timeout=300)


def test_a_built_in_model_is_registered_by_a_worker(workers: Stack) -> None:
    proc = _add(workers, "viaworker", "--arch", "mlp", "--input-shape", "16", "--classes", "4",
                "--scale", "0.5", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "this process cannot load MXNet (" in proc.stderr and "Traceback" not in proc.stderr
    record = json.loads(proc.stdout)
    assert (record["name"], record["version"], record["input_shape"], record["classes"]) == \
        ("viaworker", 1, [16], 4)
    assert record["preprocess"]["scale"] == 0.5 and record["onnx"]["file"]  # exported there too
    (stored,) = list_models(workers.settings.database, "viaworker")
    assert stored["checksum"] == record["checksum"]
    jobs = [j for j in workers.mxq_json("jobs", "--kind", "register") if j["params"]["name"] == "viaworker"]
    assert [(j["status"], j["queue"]) for j in jobs] == [("succeeded", "pool.cpu.mxnet")]


def test_an_exported_model_is_staged_registered_and_unstaged(workers: Stack, tmp_path: Path) -> None:
    from mxq.tasks.runtimes.mx import gluon, mx, nd

    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(nd.zeros((1, 5)))
    net.export(str(tmp_path / "mine"), 0)
    proc = _add(workers, "mineviaworker", "--symbol", str(tmp_path / "mine-symbol.json"),
                "--params", str(tmp_path / "mine-0000.params"), "--input-shape", "5", "--json")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["arch"] == "symbol" and record["classes"] == 3 and record["outputs"] == "logits"
    assert list((workers.home / "staging").iterdir()) == []  # the staged copies are gone
    x = np.ones((1, 5), np.float32)
    np.save(workers.home / "data" / "five.npy", x)
    done = workers.wait(json.loads(workers.mxq("infer", "mineviaworker", "five.npy", "--json").stdout)["id"])
    assert done["status"] == "succeeded", done["error"]


def test_a_model_the_worker_refuses_fails_in_one_line(workers: Stack, tmp_path: Path) -> None:
    (tmp_path / "bad-symbol.json").write_text("{not json")
    (tmp_path / "bad-0000.params").write_bytes(b"\x00" * 64)
    proc = _add(workers, "badviaworker", "--symbol", str(tmp_path / "bad-symbol.json"),
                "--params", str(tmp_path / "bad-0000.params"), "--input-shape", "5")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("mxq: error: registration job ") and " failed: " in last, proc.stderr
