"""Models proven at the batch sizes they will see, and served only from the files registered.

A symbol whose output does not follow its input's batch (a reshape to a constant shape) is
refused by `mxq models add` (shape inference at MXQ_MAX_BATCH_SIZE, nothing run), and one that
got in anyway fails its job, not its worker. Every stored file (params, symbol, ONNX export) is
checksummed at registration and verified before it is served.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from mxq.tasks.model_store import checksums
from tests.conftest import Stack


def _fixed_batch_symbol(folder: Path) -> tuple[Path, Path]:
    """An exported model whose graph reshapes to the constant (16, 64): its output has 16 rows
    whatever the batch, and MXNet running it at batch 64 corrupts memory (SIGSEGV)."""
    data = mx.sym.var("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=64, name="fc1")
    out = mx.sym.FullyConnected(mx.sym.reshape(hidden, shape=(16, 64)), num_hidden=10, name="fc2")
    net = mx.gluon.SymbolBlock(out, [data])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net.initialize()
    net(mx.nd.ones((16, 8)))
    net.export(str(folder / "fixed"))
    return folder / "fixed-symbol.json", folder / "fixed-0000.params"


def test_a_symbol_that_fixes_its_batch_is_refused_by_models_add(isolated: Stack,
                                                                 tmp_path: Path) -> None:
    symbol, params = _fixed_batch_symbol(tmp_path)
    proc = isolated.mxq("models", "add", "fixed", "--symbol", str(symbol), "--params", str(params),
                        "--input-shape", "8")
    assert proc.returncode != 0
    limit = isolated.settings.max_batch_size
    assert proc.stderr.strip().splitlines() == [
        f"mxq: error: model fixed: its output has 16 rows for a batch of {limit}: the symbol fixes the "
        "batch size (e.g. a reshape to a constant shape); allowed: symbols whose batch dimension "
        "follows the input"], proc.stderr
    assert isolated.mxq_json("models") == []
    assert not list(isolated.home.glob("models/**/fixed"))  # no files left behind


def _infer(stack: Stack, *args: str) -> dict:
    proc = stack.mxq("infer", *args, "--wait", "--json")
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def _registered_unproven(stack: Stack, name: str, symbol: Path, params: Path) -> None:
    """A version stored as mxq did before registration proved batches: its files in the store
    and its row, with no ONNX export (so the checksums of the symbol and export are unknown)."""
    from mxq.db import registry
    from mxq.preprocess import Preprocess

    folder = stack.home / "legacy-models" / name
    folder.mkdir(parents=True)
    stored = [shutil.copyfile(f, folder / f"model-{part}") for f, part in
              ((symbol, "symbol.json"), (params, "0000.params"))]
    registry.add_model(stack.settings.database, {
        "name": name, "version": 1, "arch": "symbol", "input_shape": [8], "classes": 10,
        "symbol_file": str(stored[0]), "params_file": str(stored[1]),
        "checksum": checksums.sha256(stored[1]), "source": "import:fixed-symbol.json",
        "onnx": None, "preprocess": Preprocess().as_dict()})


def test_a_fixed_batch_model_that_got_in_fails_its_job_not_the_worker(workers: Stack,
                                                                      tmp_path: Path) -> None:
    _registered_unproven(workers, "old-fixed", *_fixed_batch_symbol(tmp_path))
    np.save(workers.home / "data" / "fixed.npy", np.ones((200, 8), np.float32))
    job = _infer(workers, "old-fixed", "fixed.npy", "--engine", "mxnet", "--batch-size", "64",
                 "--device", "cpu:0")
    assert job["status"] == "failed"
    assert job["error"] == ("model old-fixed:1: its output has 16 rows for a batch of 64: the "
                            "symbol fixes the batch size (e.g. a reshape to a constant shape); "
                            "allowed: symbols whose batch dimension follows the input")
    assert job["attempts"] == 1  # failed at once: no worker died and retried it
    assert workers.job(job["id"])["status"] == "failed"


def _add(stack: Stack, name: str, seed: int) -> dict:
    proc = stack.mxq("models", "add", name, "--arch", "mlp", "--input-shape", "16", "--classes", "5",
                     "--seed", str(seed), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_every_stored_file_is_checksummed_at_registration(workers: Stack) -> None:
    model = _add(workers, "sums", 1)
    onnx = model["onnx"]
    assert onnx["sha256"] == checksums.sha256(Path(onnx["file"]))
    assert onnx["symbol_sha256"] == checksums.sha256(Path(model["symbol_file"]))
    assert model["checksum"] == checksums.sha256(Path(model["params_file"]))


@pytest.mark.parametrize("engine", ["onnx", "auto"])
def test_a_swapped_onnx_export_fails_the_job(workers: Stack, engine: str) -> None:
    victim, other = _add(workers, f"swap-{engine}", 1), _add(workers, f"swap-{engine}-other", 2)
    shutil.copyfile(other["onnx"]["file"], victim["onnx"]["file"])  # another model's weights
    np.save(workers.home / "data" / "swap.npy", np.ones((40, 16), np.float32))
    job = _infer(workers, victim["name"], "swap.npy", "--engine", engine)
    assert job["status"] == "failed"
    assert job["error"] == (
        f"ONNX file {victim['onnx']['file']} of {victim['name']}:1 does not match its recorded "
        "checksum: it changed since registration; put the original back, or register the model "
        f"again (`mxq models add {victim['name']} ...` makes a new version)")


def test_a_changed_symbol_file_fails_the_job(workers: Stack) -> None:
    model = _add(workers, "edited-symbol", 1)
    symbol = Path(model["symbol_file"])
    symbol.write_text(symbol.read_text() + "\n")  # still a valid graph, no longer the one registered
    np.save(workers.home / "data" / "edited.npy", np.ones((40, 16), np.float32))
    job = _infer(workers, "edited-symbol", "edited.npy", "--engine", "mxnet")
    assert job["status"] == "failed"
    assert job["error"].startswith(f"symbol file {symbol} of edited-symbol:1 does not match its "
                                   "recorded checksum: it changed since registration")


def test_a_file_is_hashed_once_per_process_until_it_changes(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"weights")
    expected = checksums.sha256(path)
    hashed: list[Path] = []
    real = checksums.sha256

    def counted(p: Path) -> str:
        hashed.append(p)
        return real(p)

    monkeypatch.setattr(checksums, "sha256", counted)
    for _ in range(3):
        checksums.verify(path, expected, "ONNX file", "m:1")
    assert hashed == [path]
    path.write_bytes(b"WEIGHTS")  # same size, new contents and mtime
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    with pytest.raises(checksums.ChangedFile, match="ONNX file .* of m:1 does not match"):
        checksums.verify(path, expected, "ONNX file", "m:1")
    assert hashed == [path, path]
