"""Adding a version as `mxq models add` asks for it, whichever kind of file it is: the one place
that knows both the MXNet files (`mxnet.versions`) and a plain ONNX file (`onnx_import`), which
itself builds on the store's shared parts (`output_detection`, `version_folder`); neither imports
the other."""

from __future__ import annotations

from pathlib import Path

from mxq.db.records import ModelRecord
from mxq.preprocess import Preprocess
from mxq.tasks.model_store.mxnet.versions import add_builtin, add_exported
from mxq.tasks.model_store.onnx_import import add_onnx
from mxq.workers.jobs.jobspecs import RegisterParams
from mxq.workers.settings import Settings


def add_version(settings: Settings, r: RegisterParams) -> ModelRecord:
    """A version as `mxq models add` asks for it: a built-in architecture with seeded weights,
    the exported `symbol` and `params` files, or a plain ONNX file (local paths)."""
    prep, shape = Preprocess.from_dict(r.preprocess), r.input_shape
    if r.onnx is not None:
        return add_onnx(settings, r.name, Path(r.onnx), tuple(shape) if shape else None, prep, r.outputs)
    if r.arch is not None and shape:
        return add_builtin(settings, r.name, r.arch, tuple(shape), r.classes, r.seed, preprocess=prep)
    assert r.symbol is not None and r.params is not None  # RegisterParams holds one or the other
    return add_exported(settings, r.name, Path(r.symbol), Path(r.params),
                        tuple(shape) if shape else None, prep, outputs=r.outputs)
