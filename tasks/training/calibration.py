"""The calibration sample of a precision variant (`mxq models quantize --calibration`, a
schedule's `calibration`): a training dataset, whose labels give each precision's accuracy, or
any inference input, unlabeled.

Labeled: `digits`, an `.npz` with X and y, a `.csv` with a `label` column. Anything else is read
as `mxq infer` reads it (.npy, other .npz by --key, .csv of features, .parquet, images), at most
MAX_SAMPLES of it. Paths are confined to the data root and objects to MXQ_S3_ALLOWED, as inputs are.
"""

from __future__ import annotations

import csv
import io

import numpy as np

from mxq.db.records import ModelRecord
from mxq.preprocess import Preprocess
from mxq.tasks.inference.inputs import Limits, open_input
from mxq.tasks.inference.inputs.files import Location, open_binary
from mxq.tasks.model_store.variants import MAX_HELD_OUT, Calibration, calibration_from
from mxq.tasks.training import datasets
from mxq.workers.settings import Settings
from mxq.workers.storage.locate import locate

# Enough for the default calibration and the largest held-out check, with room to spare.
MAX_SAMPLES = 4 * MAX_HELD_OUT
LABEL_COLUMN = "label"


def _labeled(path: Location) -> bool:
    """An .npz holding X and y, or a .csv whose header names a label column."""
    suffix = path.suffix.lower()
    if suffix == ".npz":
        with open_binary(path) as raw, np.load(raw) as f:
            return {"X", "y"} <= set(f.files)
    if suffix == ".csv":
        with io.TextIOWrapper(open_binary(path), newline="") as f:
            header = next(csv.reader(f), [])
        return LABEL_COLUMN in [h.strip() for h in header]
    return False


def load(settings: Settings, text: str, model: ModelRecord, key: str | None = None) -> Calibration:
    """The calibration samples at `text` for `model`, checked and preprocessed as it takes them."""
    if text in datasets.BUILTIN:
        ds = datasets.load(text)
        return calibration_from(ds.x, ds.y, text, model)
    path = locate(settings, text, "calibration file")
    if _labeled(path):
        ds = datasets.load(path, label_column=LABEL_COLUMN, limits=Limits.of(settings))
        return calibration_from(ds.x, ds.y, text, model)
    # Raw values (calibration_from scales them), images decoded in the version's layout.
    layout = Preprocess.from_dict(model.get("preprocess")).layout
    source = open_input(path, tuple(model["input_shape"]), key, Preprocess(layout=layout),
                        limits=Limits.of(settings))
    return calibration_from(source.read(0, min(source.count, MAX_SAMPLES)), None, text, model)
