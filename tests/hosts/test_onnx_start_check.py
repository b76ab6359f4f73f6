"""The ONNX Runtime start check computes (issue 60, item 7): it ran an Identity graph, which
loads neither cuBLAS nor cuDNN and has nothing to get wrong. It runs a matrix multiply and a
convolution and compares them with NumPy's; a GPU that computes wrong is refused in one line.

No GPU exists here: the CPU provider stands in for the CUDA provider (the provider table, the
one place the check names it), and a wrong result is made where a faulty GPU makes it, in what
the session's `run` hands back.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from mxq.tasks.runtimes import onnx_check, onnx_runtime, onnx_worker
from mxq.workers.hardware.pinning import REFUSAL_PREFIX, REFUSED_EXIT
from tests.conftest import ROOT

# The CPU provider computes for the GPU's; `corrupt` adds 1 to the product's element [5, 9].
STAND_IN = '''
import os
from mxq.tasks.runtimes import onnx_runtime
onnx_runtime.PROVIDERS["gpu"] = "CPUExecutionProvider"
if os.environ.get("MXQ_TEST_CORRUPT"):
    import onnxruntime
    real = onnxruntime.InferenceSession.run

    def run(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        out[0][5, 9] += 1.0
        return out

    onnxruntime.InferenceSession.run = run
'''


@pytest.fixture
def cpu_for_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(onnx_runtime.PROVIDERS, "gpu", "CPUExecutionProvider")


def _corrupt(monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    """The provider hands back the product with its element [5, 9] changed: `plus1` or `nan`."""
    real = ort.InferenceSession.run

    def run(self: ort.InferenceSession, *args: object, **kwargs: object) -> list[np.ndarray]:
        out = real(self, *args, **kwargs)
        out[0][5, 9] = out[0][5, 9] + 1.0 if change == "plus1" else np.nan
        return out

    monkeypatch.setattr(ort.InferenceSession, "run", run)


def test_the_check_graph_multiplies_and_convolves() -> None:
    check = onnx_check.check_graph()
    assert [n.op_type for n in onnx.load_from_string(check.model).graph.node] == ["MatMul", "Conv"]


@pytest.mark.usefixtures("cpu_for_gpu")
def test_a_provider_that_computes_right_passes_the_real_start_check() -> None:
    assert onnx_worker.gpu_problem("gpu:0") is None


@pytest.mark.usefixtures("cpu_for_gpu")
@pytest.mark.parametrize(("change", "gave"), [("plus1", r"-?\d+\.\d+"), ("nan", "nan")])
def test_a_corrupted_result_fails_the_start_check_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                            change: str, gave: str) -> None:
    _corrupt(monkeypatch, change)
    check = onnx_check.check_graph()
    want = check.expected[0][5, 9]
    said = onnx_worker.gpu_problem("gpu:0")
    assert said is not None and "\n" not in said
    assert re.fullmatch(
        r"gpu:0 computed the start check's matrix multiply wrong through ONNX Runtime's CUDA "
        rf"provider: 1 of 4096 values off, the first at \[5, 9\]: {gave} where NumPy gives "
        rf"{re.escape(f'{want:.6g}')} \(rounding allows 0\.\d+\): the GPU or its driver is faulty",
        said), said


def _tf32(x: np.ndarray) -> np.ndarray:
    """`x` rounded to TF32 (10 mantissa bits), as Ampere and later GPUs take float32 inputs."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def test_tf32_rounding_passes_and_a_wrong_sign_does_not() -> None:
    """A healthy Hopper GPU multiplies in TF32 by default: within the allowance; one element of
    the wrong sign is not."""
    check = onnx_check.check_graph()
    a = check.feeds["a"]
    session = ort.InferenceSession(check.model, providers=["CPUExecutionProvider"])
    exact = session.run(None, check.feeds)
    b = np.linalg.solve(a.astype(np.float64), check.expected[0])  # the initializer, recovered
    product = (_tf32(a).astype(np.float32) @ _tf32(b.astype(np.float32))).astype(np.float32)
    assert onnx_check.wrong_results("gpu:0", [product, exact[1]], check) is None
    flipped = exact[1].copy()
    flipped[0, 2, 4, 4] *= -1
    said = onnx_check.wrong_results("gpu:0", [exact[0], flipped], check) or ""
    assert said.startswith("gpu:0 computed the start check's convolution wrong") and "[0, 2, 4, 4]" in said


def test_a_worker_whose_gpu_computes_wrong_refuses_to_start(tmp_path: Path) -> None:
    """The worker as the launcher starts it for a GPU MXNet cannot run: it exits with
    REFUSED_EXIT and says why before consuming anything."""
    from mxq.db.migrate import upgrade

    upgrade(f"sqlite:///{tmp_path / 'mxq.db'}")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(STAND_IN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MXQ_")}
    env.update(MXQ_HOME=str(tmp_path), MXQ_NODE="box1", MXQ_DEVICE="gpu:0",
               MXQ_MXNET_UNUSABLE="gpu:0 (NVIDIA H200) cannot run MXNet", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=str(tmp_path / "site"), MXQ_TEST_CORRUPT="1")
    proc = subprocess.run([sys.executable, "-m", "celery", "-A", "mxq.workers", "worker", "--pool",
                           "solo", "-Q", "box1.gpu.0", "-n", "gpu0@box1", "--without-gossip",
                           "--without-mingle"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == REFUSED_EXIT, proc.stderr[-2000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith(REFUSAL_PREFIX)]
    assert line.startswith(f"{REFUSAL_PREFIX}gpu:0 computed the start check's matrix multiply wrong "
                           "through ONNX Runtime's CUDA provider: 1 of 4096 values off, the first "
                           "at [5, 9]: ")
