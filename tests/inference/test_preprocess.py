"""Preprocessing stored with a model version and applied by the worker to every input kind:
the rule's parsing and arithmetic, then real jobs over a PNG folder and an .npy against plain
MXNet on the scaled input."""

from __future__ import annotations

import json

import mxnet as mx
import numpy as np
import pytest

from mxq.db.outputs import predictions
from mxq.db.registry import resolve
from mxq.preprocess import Preprocess, PreprocessError, parse_scale
from mxq.tasks.model_store.models import load
from tests.conftest import Stack
from tests.support.images import png_bytes
from tests.support.inference import infer_and_wait


@pytest.mark.parametrize(("text", "value"), [("1/255", 1 / 255), ("0.5", 0.5), (" 2 / 4", 0.5), ("3", 3.0)])
def test_scale_is_a_number_or_a_fraction(text: str, value: float) -> None:
    assert parse_scale(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["0", "-1/255", "1/0", "abc", "nan", "inf", ""])
def test_a_scale_that_is_not_positive_and_finite_is_refused(text: str) -> None:
    with pytest.raises(PreprocessError, match=r"--scale .*: expected a positive number or fraction"):
        parse_scale(text)


def test_channel_counts_and_layouts_are_checked_against_the_model() -> None:
    Preprocess.parse("1/255", "0.5,0.4,0.3", "0.2", "NCHW").check((3, 32, 32))
    Preprocess.parse(mean="0.5,0.4,0.3", layout="nhwc").check((32, 32, 3))
    with pytest.raises(PreprocessError, match=r"--mean has 3 values; the input \(1, 8, 8\) \(NCHW\) has 1 "):
        Preprocess.parse(mean="0.5,0.4,0.3").check((1, 8, 8))
    with pytest.raises(PreprocessError, match=r"--layout NHWC needs an input shape \(H, W, C\)"):
        Preprocess.parse(layout="NHWC").check((64,))
    with pytest.raises(PreprocessError, match=r"--layout 'CHW': expected NCHW or NHWC"):
        Preprocess.parse(layout="CHW")
    with pytest.raises(PreprocessError, match=r"--std '1,0': expected positive numbers"):
        Preprocess.parse(std="1,0")


def test_apply_scales_then_normalizes_each_channel() -> None:
    x = np.random.default_rng(0).integers(0, 256, size=(4, 3, 2, 5)).astype(np.float32)
    mean, std = np.array([0.5, 0.4, 0.3]), np.array([0.2, 0.25, 0.5])
    chw = Preprocess(1 / 255, tuple(mean), tuple(std), "NCHW").apply(x)
    np.testing.assert_allclose(chw, (x / 255 - mean[:, None, None]) / std[:, None, None], rtol=1e-5,
                               atol=1e-6)
    hwc = x.transpose(0, 2, 3, 1)
    np.testing.assert_allclose(Preprocess(1 / 255, tuple(mean), tuple(std), "NHWC").apply(hwc),
                               chw.transpose(0, 2, 3, 1), rtol=1e-5)
    assert Preprocess().apply(x) is not None and np.array_equal(Preprocess().apply(x), x)
    assert Preprocess.from_dict(Preprocess(0.5, (1.0,), None, "NHWC").as_dict()) == \
        Preprocess(0.5, (1.0,), None, "NHWC")


def _images(stack: Stack, name: str, pixels: np.ndarray) -> str:
    """The same pixels (N, H, W, 3) as a PNG folder."""
    folder = stack.home / "data" / name
    folder.mkdir(exist_ok=True)
    for i, image in enumerate(pixels):
        (folder / f"{i:03d}.png").write_bytes(png_bytes(image))
    return name


def _plain(stack: Stack, model: str, x: np.ndarray) -> np.ndarray:
    """Plain MXNet over an already scaled input."""
    net, _ = load(stack.settings, resolve(stack.settings.database, model), mx.cpu())
    return mx.nd.softmax(net(mx.nd.array(x))).asnumpy()


def _stored(stack: Stack, job: dict) -> tuple[np.ndarray, np.ndarray]:
    assert job["status"] == "succeeded", job["error"]
    rows = predictions.read(stack.settings.database, job["id"])
    return np.array([r["predicted_class"] for r in rows]), np.array([r["score"] for r in rows])


def _add(stack: Stack, *args: str) -> dict:
    proc = stack.mxq("models", "add", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_png_folder_and_npy_scaled_by_the_registered_preprocessing(workers: Stack) -> None:
    pixels = np.random.default_rng(7).integers(0, 256, size=(40, 8, 8, 3)).astype(np.uint8)
    record = _add(workers, "scaled", "--arch", "lenet", "--input-shape", "3,8,8", "--scale", "1/255")
    assert record["preprocess"] == {"scale": 1 / 255, "mean": None, "std": None, "layout": "NCHW"}
    chw = pixels.transpose(0, 3, 1, 2).astype(np.float32)
    np.save(workers.home / "data" / "scaled.npy", chw)
    want = _plain(workers, "scaled", chw / 255)
    for source in (_images(workers, "scaled-png", pixels), "scaled.npy"):
        classes, scores = _stored(workers, infer_and_wait(workers, "scaled", source, "--engine", "mxnet"))
        assert np.array_equal(classes, want.argmax(axis=1)), source
        np.testing.assert_allclose(scores, want.max(axis=1), rtol=1e-4)
    unscaled = _plain(workers, "scaled", chw)  # what the worker fed before: raw 0..255
    assert not np.allclose(unscaled.max(axis=1), want.max(axis=1), rtol=1e-3)
    shown = workers.mxq("models", "scaled")
    assert "x*0.00392157 NCHW" in shown.stdout


def test_nhwc_model_gets_images_channels_last_normalized(workers: Stack) -> None:
    pixels = np.random.default_rng(8).integers(0, 256, size=(30, 8, 8, 3)).astype(np.uint8)
    _add(workers, "hwc", "--arch", "mlp", "--input-shape", "8,8,3", "--layout", "NHWC",
         "--scale", "1/255", "--mean", "0.5,0.4,0.3", "--std", "0.2,0.25,0.5")
    want = _plain(workers, "hwc", (pixels / 255 - np.array([0.5, 0.4, 0.3])) / np.array([0.2, 0.25, 0.5]))
    for engine in ("mxnet", "onnx"):
        classes, scores = _stored(workers, infer_and_wait(workers, "hwc", _images(workers, "hwc-png", pixels),
                                                  "--engine", engine))
        assert np.array_equal(classes, want.argmax(axis=1)), engine
        np.testing.assert_allclose(scores, want.max(axis=1), rtol=1e-4)


def test_bad_preprocessing_options_are_one_line_errors(workers: Stack) -> None:
    proc = workers.mxq("models", "add", "bad", "--arch", "lenet", "--input-shape", "1,8,8",
                       "--mean", "0.5,0.5,0.5")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "mxq: error: --mean has 3 values; the input (1, 8, 8) (NCHW) has 1 channel(s): give 1 value"]
    assert "bad" not in {m["name"] for m in workers.mxq_json("models")}
