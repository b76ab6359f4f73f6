"""Precision variants: `mxq models quantize` builds an int8 (or fp16) variant from the user's own
samples and checks it on held-out ones; `--precision auto --min-agreement` serves one only within
the bound and where it measured faster; every job says which precision it ran in, and why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mxq.db import registry
from mxq.db.outputs import predictions
from mxq.engines import choose_precision, precision_problem, unmeasured
from tests.conftest import Stack

VARIANT = {"file": "x", "agreement": 0.995, "bound": None}
INT8 = {"int8": VARIANT}


# The rule, pure.

def test_unset_precision_is_full_unless_the_version_allows_a_variant() -> None:
    assert choose_precision(None, None, INT8, {"int8": 9e9, "onnx": 1.0}, "onnx").precision == "fp32"
    allowed = {"int8": {**VARIANT, "bound": 0.99}}
    assert choose_precision(None, None, allowed, {"int8": 9.0, "onnx": 1.0}, "onnx").precision == "int8"


@pytest.mark.parametrize(("bound", "speeds", "precision", "words"), [
    (0.999, {"int8": 9.0, "onnx": 1.0}, "fp32", "agreement 99.50% is below the bound 99.90%"),
    (0.99, {"int8": 1.0, "onnx": 9.0}, "fp32", "int8 not faster: 1 vs onnx 9 samples/s"),
    (0.99, {"onnx": 9.0}, "fp32", "int8 not measured"),
    (0.99, {"int8": 9.0, "mxnet": 2.0, "onnx": 1.0}, "int8", "measured faster: 9 vs mxnet 2"),
])
def test_auto_serves_int8_only_within_the_bound_and_faster(bound: float, speeds: dict, precision: str,
                                                           words: str) -> None:
    fp32 = max(("mxnet", "onnx"), key=lambda e: speeds.get(e, 0.0))
    chosen = choose_precision("auto", bound, INT8, speeds, fp32)
    assert (chosen.precision, words in chosen.reason) == (precision, True), chosen.reason


@pytest.mark.parametrize(("fp16", "speeds", "precision", "words"), [
    (0.999, {"int8": 5.0, "fp16": 9.0, "onnx": 1.0}, "fp16", "fp16 agreement 99.90% meets the bound"),
    (0.999, {"int8": 9.0, "fp16": 5.0, "onnx": 1.0}, "int8", "measured faster: 9 vs onnx 1"),
    (0.98, {"int8": 5.0, "fp16": 9.0, "onnx": 1.0}, "int8", "measured faster: 5 vs onnx 1"),
    (0.999, {"int8": 0.5, "fp16": 0.7, "onnx": 1.0}, "fp32", "int8 not faster: 0 vs onnx 1 samples/s; "
                                                            "fp16 not faster"),
])
def test_auto_runs_the_fastest_variant_within_the_bound(fp16: float, speeds: dict, precision: str,
                                                        words: str) -> None:
    variants = {**INT8, "fp16": {**VARIANT, "agreement": fp16}}
    chosen = choose_precision("auto", 0.99, variants, speeds, "onnx")
    assert (chosen.precision, words in chosen.reason) == (precision, True), chosen.reason
    if precision == "int8" and fp16 < 0.99:
        assert "fp16 variant agreement 98.00% is below the bound 99.00%" in chosen.reason


def test_only_a_variant_within_its_bound_is_measured() -> None:
    assert unmeasured("auto", 0.99, INT8, {"onnx": 1.0}) == ["int8"]
    assert unmeasured("auto", 0.999, INT8, {"onnx": 1.0}) == []  # it could never serve
    assert unmeasured("fp32", None, INT8, None) == []
    assert unmeasured("auto", 0.99, INT8, {"int8": 5.0}) == []
    both = {**INT8, "fp16": {**VARIANT, "agreement": 0.9999}}
    assert unmeasured("auto", 0.999, both, {"onnx": 1.0}) == ["fp16"]
    assert unmeasured("auto", 0.99, both, {"onnx": 1.0}) == ["int8", "fp16"]


@pytest.mark.parametrize(("asked", "bound", "variants", "engine", "words"), [
    ("int8", None, {}, "auto", "has no int8 variant; build one with `mxq models quantize m:1"),
    ("fp16", None, INT8, "auto", "has no fp16 variant; build one with `mxq models quantize m:1 "
                                 "--calibration FILE --precision fp16`"),
    ("int8", None, INT8, "mxnet", "allowed with --engine auto or onnx"),
    ("auto", None, INT8, "auto", "--precision auto needs a bound"),
    ("fp32", 0.9, INT8, "auto", "--min-agreement goes with --precision auto"),
])
def test_a_precision_that_cannot_be_honoured_is_refused(asked: str, bound: float | None,
                                                        variants: dict, engine: str,
                                                        words: str) -> None:
    assert words in (precision_problem(asked, bound, variants, "m:1", engine) or "")


# Through the CLI and real workers.

def _mxq_json(stack: Stack, *args: str, code: int = 0) -> dict:
    proc = stack.mxq(*args, "--json")
    assert proc.returncode == code, proc.stderr
    return json.loads(proc.stdout)


def _infer(stack: Stack, *args: str) -> dict:
    return _mxq_json(stack, "infer", *args, "--wait")


def _untrained_lenet(stack: Stack, name: str) -> dict:
    _mxq_json(stack, "models", "add", name, "--arch", "lenet", "--input-shape", "1,8,8",
              "--scale", "1/16")
    return _mxq_json(stack, "models", "quantize", name, "--calibration", "digits")


def _digits_input(stack: Stack, name: str) -> tuple[str, np.ndarray]:
    from sklearn.datasets import load_digits

    x = load_digits().images.astype(np.float32)[:600, None]
    np.save(stack.home / "data" / name, x)
    return name, x


def _assert_served_by(stack: Stack, job: dict, variant: dict, x: np.ndarray) -> None:
    """The job's stored classes are those the variant's own file gives for the digits `x`."""
    from mxq.tasks.model_store.variants import _probabilities

    expected = _probabilities(Path(variant["file"]), (x / 16).astype(np.float32))
    rows = predictions.read(stack.settings.database, job["id"])
    assert [r["predicted_class"] for r in rows] == expected.argmax(axis=1).tolist()


def test_quantize_stores_the_variants_checks_on_held_out_samples(stack: Stack) -> None:
    variant = _untrained_lenet(stack, "q-check")
    assert Path(variant["file"]).is_file() and Path(variant["file"]).name == "model.int8.onnx"
    assert variant["held_out"] == int(1797 * 0.25) and variant["calibration"]["samples"] == 256
    assert 0.0 <= variant["agreement"] <= 1.0 and variant["max_diff"] > 0.0
    assert set(variant["accuracy"]) == {"fp32", "int8"}  # digits has labels
    shown = _mxq_json(stack, "models", "q-check")[0]
    assert shown["variants"]["int8"]["sha256"] == variant["sha256"]
    unlabeled, _ = _digits_input(stack, "q-unlabeled.npy")
    again = _mxq_json(stack, "models", "quantize", "q-check", "--calibration", unlabeled, "--samples", "64")
    assert again["accuracy"] is None and again["calibration"]["samples"] == 64
    assert again["held_out"] == 150


@pytest.mark.parametrize(("args", "words"), [
    (("--calibration", "nowhere.npy"), "nowhere.npy"),
    (("--calibration", "digits", "--samples", "0"), "--samples 0: allowed 1 to 100000"),
    (("--calibration", "digits", "--min-agreement", "1.5"), "--min-agreement 1.5: allowed 0 to 1"),
    (("--calibration", "digits", "--precision", "int4"), "--precision 'int4': allowed int8, fp16"),
])
def test_quantize_refuses_bad_input_in_one_line(stack: Stack, args: tuple[str, ...], words: str) -> None:
    stack.mxq("models", "add", "q-bad", "--arch", "lenet", "--input-shape", "1,8,8")
    proc = stack.mxq("models", "quantize", "q-bad", *args)
    assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr
    wrong_shape = np.zeros((200, 5), np.float32)
    np.save(stack.home / "data" / "q-wrong.npy", wrong_shape)
    proc = stack.mxq("models", "quantize", "q-bad", "--calibration", "q-wrong.npy")
    assert proc.returncode == 2 and "q-wrong.npy" in proc.stderr


def test_a_variant_below_its_bound_leaves_auto_in_float32_with_the_reason(workers: Stack) -> None:
    variant = _untrained_lenet(workers, "q-below")
    assert variant["agreement"] < 0.99  # untrained: near-tied scores, so int8 often flips them
    name, _ = _digits_input(workers, "q-below.npy")
    job = _infer(workers, "q-below", name, "--precision", "auto", "--min-agreement", "0.99")
    assert job["status"] == "succeeded", job["error"]
    assert job["result"]["precision"] == "fp32"
    assert job["result"]["precision_reason"] == (f"int8 variant agreement {variant['agreement']:.2%} "
                                                 "is below the bound 99.00%")
    speeds = _mxq_json(workers, "models", "q-below")[0]["engines"]["cpu"]
    assert "int8" not in speeds  # a variant that can never serve is not even measured


@pytest.mark.slow
def test_auto_measures_the_variant_and_runs_the_faster_precision(workers: Stack) -> None:
    """The variant is measured in the same turns as both full-precision engines, whose figures
    from another moment (here, made up) are replaced: every choice compares figures of one run."""
    variant = _untrained_lenet(workers, "q-auto")
    registry.record_engine_speeds(workers.settings.database, "q-auto", 1, "cpu",
                                  {"mxnet": 1.0, "onnx": 1e9})
    name, _ = _digits_input(workers, "q-auto.npy")
    assert variant["agreement"] >= 0.5
    # Met on the held-out samples and on the input's first ones (as the job checks): speed decides.
    job = _infer(workers, "q-auto", name, "--precision", "auto", "--min-agreement", "0.5")
    assert job["status"] == "succeeded", job["error"]
    speeds = _mxq_json(workers, "models", "q-auto")[0]["engines"]["cpu"]
    assert speeds["int8"] > 0 and speeds["mxnet"] > 1.0 and speeds["onnx"] < 1e9
    fp32 = "onnx" if speeds["onnx"] > speeds["mxnet"] else "mxnet"
    faster = "int8" if speeds["int8"] > speeds[fp32] else "fp32"
    result = job["result"]
    assert (result["precision"], result["engine"]) == (faster, "onnx" if faster == "int8" else fp32)
    assert f"vs {fp32} {speeds[fp32]:.0f} samples/s" in result["precision_reason"], result


def test_int8_serves_when_faster_and_its_predictions_are_the_variants(workers: Stack) -> None:
    variant = _untrained_lenet(workers, "q-int8")
    registry.record_engine_speeds(workers.settings.database, "q-int8", 1, "cpu",
                                  {"mxnet": 100.0, "onnx": 200.0, "int8": 9000.0})
    name, x = _digits_input(workers, "q-int8.npy")
    job = _infer(workers, "q-int8", name, "--precision", "auto", "--min-agreement", "0.5",
                 "--batch-size", "200")
    assert job["status"] == "succeeded", job["error"]
    assert (job["result"]["engine"], job["result"]["precision"]) == ("onnx", "int8")
    assert "measured faster: 9000 vs onnx 200" in job["result"]["precision_reason"]
    _assert_served_by(workers, job, variant, x)
    forced = _infer(workers, "q-int8", name, "--precision", "fp32")
    assert (forced["result"]["precision"], forced["result"]["precision_reason"]) == ("fp32", "asked")
    int8 = _infer(workers, "q-int8", name, "--precision", "int8")["result"]
    assert int8["precision_reason"].startswith("asked; int8 agreed with float32 on ")
    assert int8["precision_reason"].endswith(" of this input's first 256 samples")


def test_a_variants_check_of_an_input_is_remembered_until_the_input_changes(workers: Stack) -> None:
    """A worker that checked the int8 variant on an input's first samples keeps the figure: the
    next job over the same input (on the same device: the figure is the worker's) reads no
    samples for the check and says so in `variant_check`; the same input rewritten is checked
    again, as its identity at submit changed. A job that checks keeps the variant's outputs on
    the checked samples as its own first predictions (`samples_reused`), the same as a job that
    computes them in its batches."""
    _untrained_lenet(workers, "q-memo")
    name, x = _digits_input(workers, "q-memo.npy")
    jobs = [_infer(workers, "q-memo", name, "--precision", "int8", "--device", "cpu:0")
            for _ in range(2)]
    ran = [j["result"] for j in jobs]
    assert [r["variant_check"]["remembered"] for r in ran] == [False, True]
    assert [r["variant_check"]["samples_reused"] for r in ran] == [256, 0]
    for r in ran:  # the job's start holds its engine's making and its check
        costs = r["fixed_costs"]
        assert costs["variant_check"] == r["variant_check"]["seconds"]
        assert costs["claim_to_first_batch"] >= costs["model_load"] + costs["variant_check"] > 0
        assert costs["last_flush"] >= 0
    kept, computed = (predictions.read(workers.settings.database, j["id"]) for j in jobs)
    assert [r["index"] for r in kept] == list(range(len(x)))
    assert [r["predicted_class"] for r in kept] == [r["predicted_class"] for r in computed]
    np.testing.assert_allclose([r["score"] for r in kept], [r["score"] for r in computed], rtol=1e-5)
    np.save(workers.home / "data" / "q-memo-few.npy", x[:100])  # the check's samples are the job
    few = _infer(workers, "q-memo", "q-memo-few.npy", "--precision", "int8", "--device", "cpu:0")
    assert few["result"]["variant_check"]["samples_reused"] == 100
    assert [r["predicted_class"] for r in predictions.read(workers.settings.database, few["id"])] \
        == [r["predicted_class"] for r in computed[:100]]
    assert ran[0]["variant_check"]["seconds"] > ran[1]["variant_check"]["seconds"] >= 0
    assert ran[0]["precision_reason"] == ran[1]["precision_reason"]  # the same figure, on 256 samples
    np.save(workers.home / "data" / name, x[::-1].copy())  # other bytes, another identity
    again = _infer(workers, "q-memo", name, "--precision", "int8", "--device", "cpu:0")["result"]
    assert again["variant_check"]["remembered"] is False
    fp32 = _infer(workers, "q-memo", name, "--precision", "fp32", "--device", "cpu:0")["result"]
    assert fp32["variant_check"] is None

def test_an_fp16_variant_is_checked_and_serves_beside_int8_by_measured_speed(workers: Stack) -> None:
    int8 = _untrained_lenet(workers, "q-fp16")
    fp16 = _mxq_json(workers, "models", "quantize", "q-fp16", "--calibration", "digits",
                     "--precision", "fp16")
    assert Path(fp16["file"]).name == "model.fp16.onnx" and fp16["calibration"]["samples"] == 0
    assert set(fp16["accuracy"]) == {"fp32", "fp16"} and fp16["held_out"] == int8["held_out"]
    assert fp16["agreement"] >= int8["agreement"]  # float16 rounds far less than 8 bits
    assert 0.0 < fp16["max_diff"] < 0.01
    shown = _mxq_json(workers, "models", "q-fp16")[0]["variants"]
    assert set(shown) == {"int8", "fp16"} and shown["int8"]["sha256"] == int8["sha256"]
    registry.record_engine_speeds(workers.settings.database, "q-fp16", 1, "cpu",
                                  {"mxnet": 100.0, "onnx": 200.0, "int8": 900.0, "fp16": 5000.0})
    name, x = _digits_input(workers, "q-fp16.npy")
    job = _infer(workers, "q-fp16", name, "--precision", "auto", "--min-agreement", "0.0")
    assert (job["result"]["engine"], job["result"]["precision"]) == ("onnx", "fp16"), job["result"]
    assert "int8 slower than fp16: 900 samples/s" in job["result"]["precision_reason"]
    _assert_served_by(workers, job, fp16, x)
    forced = _infer(workers, "q-fp16", name, "--precision", "int8")
    assert forced["result"]["precision"] == "int8"
    assert forced["result"]["precision_reason"].startswith("asked; int8 agreed with float32 on ")


@pytest.mark.slow
def test_a_version_quantized_with_a_bound_lets_unset_jobs_use_it(workers: Stack) -> None:
    workers.mxq("models", "add", "q-version", "--arch", "lenet", "--input-shape", "1,8,8", "--scale", "1/16")
    _mxq_json(workers, "models", "quantize", "q-version", "--calibration", "digits", "--min-agreement", "0.5")
    registry.record_engine_speeds(workers.settings.database, "q-version", 1, "cpu",
                                  {"mxnet": 100.0, "onnx": 200.0, "int8": 9000.0})
    name, _ = _digits_input(workers, "q-version.npy")
    job = _infer(workers, "q-version", name)
    assert job["result"]["precision"] == "int8", job["result"]["precision_reason"]
    assert "meets the bound 50.00%" in job["result"]["precision_reason"]


def test_quantize_refuses_samples_that_cannot_check_a_variant_and_keeps_the_one_built(
        stack: Stack) -> None:
    """A constant calibration file (its held-out samples are copies of its calibration ones)
    and one holding NaN are refused in one line; the variant built before stays, file and
    record (a NaN calibration once deleted the file while the registry still listed it)."""
    built = _untrained_lenet(stack, "q-keep")
    for name, data, words in [
            ("q-constant.npy", np.full((400, 1, 8, 8), 3.0, np.float32),
             "only 1 different samples among 400; at least 48 are needed"),
            ("q-nan.npy", np.where(np.arange(400)[:, None, None, None] == 7, np.nan,
                                   np.random.default_rng(0).random((400, 1, 8, 8))),
             "sample 7 holds NaN or an infinity")]:
        np.save(stack.home / "data" / name, data)
        proc = stack.mxq("models", "quantize", "q-keep", "--calibration", name)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    kept = _mxq_json(stack, "models", "q-keep")[0]["variants"]["int8"]
    assert kept["sha256"] == built["sha256"] and Path(kept["file"]).is_file()


def test_a_variant_that_fails_after_it_is_built_leaves_the_one_in_service(stack: Stack) -> None:
    """A variant built again from samples that pass every check (finite, spread, finite after
    preprocessing) but fail once it is built (beyond float16's range, its outputs are NaN) is
    built beside the variant in service and never replaces it: the old file stays byte for
    byte, the registry names it, and nothing of the failed build is left."""
    _untrained_lenet(stack, "q-swap")
    built = _mxq_json(stack, "models", "quantize", "q-swap", "--calibration", "digits",
                      "--precision", "fp16")
    target = Path(built["file"])
    before, folder = target.read_bytes(), sorted(target.parent.iterdir())
    huge = np.random.default_rng(3).uniform(1e6, 1e7, (400, 1, 8, 8)).astype(np.float32)
    np.save(stack.home / "data" / "q-swap-huge.npy", huge)
    proc = stack.mxq("models", "quantize", "q-swap", "--calibration", "q-swap-huge.npy",
                     "--precision", "fp16")
    assert proc.returncode == 2, proc.stderr
    assert target.read_bytes() == before and sorted(target.parent.iterdir()) == folder
    kept = _mxq_json(stack, "models", "q-swap")[0]["variants"]["fp16"]
    assert (kept["file"], kept["sha256"]) == (built["file"], built["sha256"])
    assert "cannot build a fp16 variant: its outputs are not finite" in proc.stderr, proc.stderr
    assert "the one built before still serves" in proc.stderr and "Traceback" not in proc.stderr


def test_a_calibration_that_preprocessing_overflows_blames_the_preprocessing(stack: Stack) -> None:
    """Samples finite in the file that the version's --std turns into infinities: the error says
    so, where it once said only "holds NaN or an infinity (after the version's preprocessing)"."""
    _mxq_json(stack, "models", "add", "q-tiny-std", "--arch", "lenet", "--input-shape", "1,8,8",
              "--std", "1e-30")
    data = np.random.default_rng(2).random((400, 1, 8, 8)).astype(np.float32)
    data[7, 0, 0, 0] = 1e10
    np.save(stack.home / "data" / "q-tiny-std.npy", data)
    proc = stack.mxq("models", "quantize", "q-tiny-std", "--calibration", "q-tiny-std.npy")
    assert proc.returncode == 2, proc.stderr
    assert ("sample 7 is finite, but the preprocessing of q-tiny-std:1 (x*1 /1e-30 NCHW) turns "
            "it into NaN or an infinity in float32") in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_precision_that_cannot_be_honoured_fails_at_submit(stack: Stack) -> None:
    stack.mxq("models", "add", "q-none", "--arch", "lenet", "--input-shape", "1,8,8")
    name, _ = _digits_input(stack, "q-none.npy")
    for args, words in [(("--precision", "int8"), "q-none:1 has no int8 variant"),
                        (("--precision", "auto"), "--precision auto needs a bound"),
                        (("--precision", "auto", "--min-agreement", "2"), "min_agreement")]:
        proc = stack.mxq("infer", "q-none", name, *args, "--allow-offline")
        assert proc.returncode in (1, 2) and words in proc.stderr, proc.stderr  # 1: recorded failed
    proc = stack.mxq("train", "lenet", "digits", "--name", "q-train", "--calibration", "digits",
                     "--variants", "int8,int4", "--allow-offline")
    assert proc.returncode in (1, 2) and "int4" in proc.stderr and "fp16" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_gpu_device_runs_no_int8_variant_and_says_why() -> None:
    """ONNX Runtime's CUDA provider has no kernels for the int8 variant's quantized operators:
    on a GPU they ran node by node on the CPU. A GPU runs fp16 only; a CPU both."""
    from mxq.engines import variants_for

    both = {**INT8, "fp16": {**VARIANT, "agreement": 0.999}}
    assert variants_for("cpu", both) == (both, None)
    runs, note = variants_for("gpu", both)
    assert list(runs) == ["fp16"] and note is not None
    assert note.startswith("int8 not on gpu devices: ONNX Runtime's CUDA provider has no kernels")
    chosen = choose_precision("auto", 0.99, runs, {"int8": 9e9, "fp16": 5.0, "onnx": 1.0}, "onnx")
    assert chosen.precision == "fp16"  # the int8 figure, the faster, is never considered
