"""The start check of a GPU worker that serves with ONNX Runtime: a real matrix multiply (cuBLAS)
and convolution (cuDNN) through the CUDA provider, compared with NumPy's.

Counting providers proves nothing: ONNX Runtime falls back to the CPU in silence when CUDA cannot
start, and a GPU that loads its libraries can still compute wrong (a failing memory, a driver
that needs a reset). So the worker runs a small graph of both operations on fixed seeded inputs
and refuses its GPU, in one line naming the operation and the value, when a result is off by more
than float32 rounding allows. Ampere and later GPUs multiply float32 in TF32 by default (inputs
rounded to 10 mantissa bits), so the allowance is TF32's: each element may be off by
`ROUNDING` times what the same operation gives on the inputs' absolute values (the classic
bound of a dot product's rounding error), never by a wrong value or a NaN.
"""

from __future__ import annotations

import contextlib
import io
import re
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from mxq.errors import first_line
from mxq.tasks.runtimes.onnx_runtime import PROVIDERS, load_cuda_wheels

# A 64x64 matrix multiply and a 3x3 convolution of a 3x16x16 image into 8 channels.
CHECK_SIDE, CHECK_IMAGE, CHECK_FILTERS, CHECK_KERNEL = 64, (1, 3, 16, 16), 8, 3
CHECK_SEED = 7
# Each input rounded to TF32 (2^-11 each, so about 2^-10 on a product) and float32 sums over at
# most 64 terms (64 * 2^-24): about 1e-3 of the absolute-value product, doubled for margin.
ROUNDING = 2e-3


class Check(NamedTuple):
    """The check graph, its inputs, and per output NumPy's answer and each element's allowance."""

    model: bytes
    feeds: dict[str, NDArray[np.float32]]
    expected: list[NDArray[np.float64]]
    allowed: list[NDArray[np.float64]]


def cuda_problem(device: str) -> str | None:
    """Why ONNX Runtime's CUDA provider does not really run on this worker's GPU, else None:
    it cannot start (no GPU, no driver: its fallback to the CPU counts as that), or the GPU
    computes the check graph wrong."""
    import onnxruntime as ort

    check = check_graph()
    said = io.StringIO()  # ONNX Runtime prints why CUDA failed, then falls back to the CPU
    try:
        load_cuda_wheels(ort)
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            sess = ort.InferenceSession(check.model, providers=[PROVIDERS["gpu"]])
        got = sess.run(None, check.feeds)
    except Exception as exc:
        return f"ONNX Runtime's CUDA provider cannot start on {device}: {first_line(exc)}"
    if PROVIDERS["gpu"] not in sess.get_providers():
        found = re.search(r"CUDA failure \d+: [^;]*?(?= ;|$)", said.getvalue(), re.MULTILINE)
        cause = f" ({found.group(0).strip()})" if found else ""
        return (f"ONNX Runtime's CUDA provider cannot start on {device}{cause}: no GPU visible, or "
                "the driver is missing or older than R525, which CUDA 12 needs; it would run on the CPU")
    return wrong_results(device, got, check)


def check_graph() -> Check:
    """The check graph (MatMul and Conv) on inputs seeded with CHECK_SEED, with NumPy's answers
    in float64 and what rounding allows each element."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(CHECK_SEED)
    a = rng.standard_normal((CHECK_SIDE, CHECK_SIDE)).astype(np.float32)
    b = rng.standard_normal((CHECK_SIDE, CHECK_SIDE)).astype(np.float32)
    image = rng.standard_normal(CHECK_IMAGE).astype(np.float32)
    weights = rng.standard_normal((CHECK_FILTERS, CHECK_IMAGE[1], CHECK_KERNEL, CHECK_KERNEL)
                                  ).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["product"]),
         helper.make_node("Conv", ["image", "weights"], ["features"], pads=[1, 1, 1, 1])],
        "start-check",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a.shape)),
         helper.make_tensor_value_info("image", TensorProto.FLOAT, list(image.shape))],
        [helper.make_tensor_value_info("product", TensorProto.FLOAT, [CHECK_SIDE, CHECK_SIDE]),
         helper.make_tensor_value_info("features", TensorProto.FLOAT,
                                       [1, CHECK_FILTERS, *CHECK_IMAGE[2:]])],
        initializer=[numpy_helper.from_array(b, "b"), numpy_helper.from_array(weights, "weights")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    a64, b64, image64, weights64 = (x.astype(np.float64) for x in (a, b, image, weights))
    return Check(model.SerializeToString(), {"a": a, "image": image},
                 [a64 @ b64, _convolve(image64, weights64)],
                 [ROUNDING * (np.abs(a64) @ np.abs(b64)),
                  ROUNDING * _convolve(np.abs(image64), np.abs(weights64))])


def _convolve(image: NDArray[np.float64], weights: NDArray[np.float64]) -> NDArray[np.float64]:
    """The 3x3 convolution (padding 1) in float64, one tap at a time."""
    padded = np.pad(image, ((0, 0), (0, 0), (1, 1), (1, 1)))
    height, width = image.shape[2:]
    out = np.zeros((image.shape[0], weights.shape[0], height, width))
    for i in range(CHECK_KERNEL):
        for j in range(CHECK_KERNEL):
            out += np.einsum("nchw,fc->nfhw", padded[:, :, i:i + height, j:j + width],
                             weights[:, :, i, j])
    return out


def wrong_results(device: str, got: list[NDArray[np.generic]], check: Check) -> str | None:
    """Why the check graph's results `got` on `device` are not NumPy's, in one line naming the
    operation, the first element off, and what it should be; None when every element is within
    rounding. A NaN is off."""
    names = ("matrix multiply", "convolution")
    for name, raw, want, allowed in zip(names, got, check.expected, check.allowed, strict=True):
        out = np.asarray(raw, dtype=np.float64)
        if out.shape != want.shape:
            return (f"{device} computed the start check's {name} wrong through ONNX Runtime's CUDA "
                    f"provider: shape {out.shape} where NumPy gives {want.shape}: the GPU or its "
                    "driver is faulty")
        off = ~(np.abs(out - want) <= allowed)  # NaN compares False: off
        if off.any():
            at = tuple(int(i) for i in np.argwhere(off)[0])
            return (f"{device} computed the start check's {name} wrong through ONNX Runtime's CUDA "
                    f"provider: {int(off.sum())} of {off.size} values off, the first at {list(at)}: "
                    f"{out[at]:.6g} where NumPy gives {want[at]:.6g} (rounding allows "
                    f"{allowed[at]:.2g}): the GPU or its driver is faulty")
    return None
