"""Training datasets from every supported source, and their label checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mxq.tasks.inference.inputs import InputError
from mxq.tasks.training import datasets
from tests.support.images import png_bytes, solid


def test_digits_and_a_seeded_split() -> None:
    ds = datasets.digits()
    assert ds.x.shape == (1797, 1, 8, 8) and ds.classes == 10 and 0 <= ds.x.min() and ds.x.max() == 16
    assert ds.preprocess.scale == 1 / 16 and ds.for_training().x.max() == 1.0  # as scikit-learn scales
    a_train, a_val = datasets.split(ds, 0.2, seed=7)
    b_train, b_val = datasets.split(ds, 0.2, seed=7)
    other_val = datasets.split(ds, 0.2, seed=8)[1]
    assert a_val is not None and b_val is not None and other_val is not None
    assert len(a_val.y) == 359 and np.array_equal(a_val.y, b_val.y)
    assert not np.array_equal(other_val.y, a_val.y)


def test_image_folder_one_subfolder_per_class(tmp_path: Path) -> None:
    for label, colour in enumerate([(250, 0, 0), (0, 0, 250)]):
        folder = tmp_path / "imgs" / f"class{label}"
        folder.mkdir(parents=True)
        for i in range(3):
            (folder / f"{i}.png").write_bytes(png_bytes(solid(colour)))
    ds = datasets.load(tmp_path / "imgs", (3, 8, 8))
    assert ds.x.shape == (6, 3, 8, 8) and ds.classes == 2
    assert ds.y.tolist() == [0, 0, 0, 1, 1, 1]
    assert ds.x[0, 0].mean() > ds.x[0, 2].mean() and ds.x[5, 2].mean() > ds.x[5, 0].mean()


def test_recordio_labels_come_from_the_headers(tmp_path: Path) -> None:
    import mxnet as mx

    rec, idx = tmp_path / "d.rec", tmp_path / "d.idx"
    writer = mx.recordio.MXIndexedRecordIO(str(idx), str(rec), "w")
    for i in range(6):
        header = mx.recordio.IRHeader(0, float(i % 3), i, 0)
        writer.write_idx(i, mx.recordio.pack(header, png_bytes(solid((10 * i, 0, 0)))))
    writer.close()
    ds = datasets.load(rec, (3, 4, 6))
    assert ds.classes == 3 and ds.y.tolist() == [0, 1, 2, 0, 1, 2] and ds.x.shape == (6, 3, 4, 6)


def test_csv_label_column_and_npz(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("f1,kind,f2\n0.5,1,2\n1.5,0,3\n")
    ds = datasets.load(tmp_path / "t.csv", label_column="kind")
    assert ds.x.tolist() == [[0.5, 2.0], [1.5, 3.0]] and ds.y.tolist() == [1, 0]
    np.savez(tmp_path / "d.npz", X=np.ones((4, 3)), y=np.array([0, 1, 2, 1]))
    assert datasets.load(tmp_path / "d.npz").classes == 3


@pytest.mark.parametrize("y, needle", [
    (np.array([0, 1, -1, 1]), "labels must be class indexes"),
    (np.array([0, 1.5, 1, 0]), "labels must be class indexes"),
    (np.zeros(4), "has a single class"),
    (np.array([0, 1, 0]), "has 4 samples but 3 labels"),
])
def test_bad_labels_are_refused(tmp_path: Path, y: np.ndarray, needle: str) -> None:
    np.savez(tmp_path / "bad.npz", X=np.ones((4, 2)), y=y)
    with pytest.raises(InputError, match=needle):
        datasets.load(tmp_path / "bad.npz")
