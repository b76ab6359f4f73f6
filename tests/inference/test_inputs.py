"""Input readers: every format read back exactly, every bad input refused with a message naming it.

Images are written with a tiny stdlib PNG encoder (tests/support/images.py): cv2 is not
installed, so mxnet's `pack_img`/`unpack_img` can't be used, while MXNet's own decoder
(`imread`/`imdecode`) works.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mxq.tasks.inference.inputs import InputError, count_samples, npy, open_input
from mxq.workers.paths import PathError, inside_root
from tests.support.images import png_bytes, solid

ROOT = Path(__file__).resolve().parents[2]


COLOURS = [(200, 0, 10), (0, 100, 255), (30, 60, 90)]


@pytest.fixture
def image_dir(tmp_path: Path) -> Path:
    """Three solid images named so that sorting by name, not creation order, matters."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    for name, colour in zip(["b.png", "a.PNG", "c.png"], [COLOURS[1], COLOURS[0], COLOURS[2]], strict=True):
        (folder / name).write_bytes(png_bytes(solid(colour)))
    (folder / "notes.txt").write_text("not an image")
    return folder


def write_rec(tmp_path: Path, images: list[np.ndarray]) -> Path:
    import mxnet as mx

    rec, idx = tmp_path / "data.rec", tmp_path / "data.idx"
    writer = mx.recordio.MXIndexedRecordIO(str(idx), str(rec), "w")
    for i, img in enumerate(images):
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(i), i, 0), png_bytes(img)))
    writer.close()
    return rec


# --- .npy -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("small_limit, mapped", [(1 << 20, False), (100, True)])
def test_npy_is_read_whole_when_small_and_mapped_when_large(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_limit: int, mapped: bool) -> None:
    monkeypatch.setattr(npy, "SMALL_NPY_BYTES", small_limit)
    data = np.arange(10 * 64, dtype=np.int16).reshape(10, 64)
    path = tmp_path / "x.npy"
    np.save(path, data)
    assert isinstance(npy.load(path), np.memmap) is mapped
    src = open_input(path, (64,))
    batch = src.read(3, 7)
    assert src.count == 10 and src.sample_shape == (64,)
    assert batch.dtype == np.float32 and batch.shape == (4, 64)
    np.testing.assert_array_equal(batch, data[3:7].astype(np.float32))
    np.save(path, np.asfortranarray(data))  # column-major data reads back the same
    np.testing.assert_array_equal(open_input(path, (64,)).read(0, 10), data.astype(np.float32))


def _resident_bytes(name: str) -> int:
    """This process's resident bytes in mappings of a file called `name` (/proc/self/smaps)."""
    total, current = 0, ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split()
        if "-" in parts[0]:  # a mapping's first line: range, perms, offset, dev, inode[, path]
            current = parts[5] if len(parts) > 5 else ""
        elif parts[0] == "Rss:" and current.endswith(name):
            total += int(parts[1]) * 1024
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc/self/smaps")
@pytest.mark.slow  # a resident-memory measurement over 6 s of reads: make test-all (CI) runs it
def test_mapped_npy_stays_out_of_resident_memory(tmp_path: Path) -> None:
    """A worker's memory must not grow with its input: the pages behind the reads are dropped,
    and the pages the kernel maps back around a fault (about 2 % of the file was left resident
    before); each batch is read in place, and every value read is the file's."""
    path = tmp_path / "big.npy"
    samples, batch = 60_000, 37  # 188 MB; batches of 116 KB that do not line up with pages
    np.save(path, np.random.default_rng(0).normal(size=(samples, 784)).astype(np.float32))
    src = open_input(path, (784,))
    peak, total = 0, 0.0
    for n, i in enumerate(range(0, samples, batch)):
        x = src.read(i, min(i + batch, samples))
        total += float(x.sum(dtype=np.float64))  # every page of the batch touched
        if n % 16 == 0:  # (what stays behind only adds up)
            peak = max(peak, _resident_bytes("big.npy"))
    assert total == pytest.approx(float(np.load(path).sum(dtype=np.float64)), rel=1e-9)
    bound = npy.KEEP_MAPPED_BYTES + npy.DROP_STEP_BYTES + 512 * 1024
    assert peak <= bound, f"{peak / 2**20:.1f} MiB of the input resident"


def test_npy_header_written_by_python_2_is_read(tmp_path: Path) -> None:
    """Old headers carry `L` suffixes, which only NumPy's own (slower) reader accepts."""
    data = np.arange(12, dtype="<f4").reshape(3, 4)
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (3L, 4L), }"
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    path = tmp_path / "old.npy"
    path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data.tobytes())
    assert count_samples(path) == 3
    np.testing.assert_array_equal(open_input(path, (4,)).read(0, 3), data)



@pytest.mark.parametrize("array", [
    np.zeros((2, 1, 28, 28), np.float32), np.zeros(5), np.asfortranarray(np.zeros((3, 4))),
    np.zeros(2, ">i8"), np.zeros((0, 3), np.uint8), np.zeros((4,), bool),
    np.zeros(3, [("a", "<f4")]),  # not the plain form: read by NumPy's own reader
], ids=lambda a: f"{a.dtype}{a.shape}")
def test_npy_header_matches_numpys_reader(tmp_path: Path, array: np.ndarray) -> None:
    path = tmp_path / "h.npy"
    np.save(path, array)
    with path.open("rb") as f:
        ours, at = npy.parse_header(f), f.tell()
    with path.open("rb") as f:
        np.lib.format.read_magic(f)
        assert ours == np.lib.format.read_array_header_1_0(f) and at == f.tell()

def test_npy_truncated_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.npy"
    np.save(path, np.zeros((100, 8), dtype=np.float32))
    path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(InputError, match=rf"input {path} is truncated or corrupt: "):
        open_input(path, (8,))
    path.write_bytes(path.read_bytes()[:40])  # cut inside the header
    with pytest.raises(InputError, match="truncated or corrupt"):
        count_samples(path)


def test_npy_garbage_is_corrupt_not_a_pickle_error(tmp_path: Path) -> None:
    path = tmp_path / "g.npy"
    path.write_bytes(b"this is not numpy at all")
    with pytest.raises(InputError, match="truncated or corrupt"):
        open_input(path, (8,))


@pytest.mark.parametrize("array, dtype_name", [
    (np.array([[1, "a"]], dtype=object), "object"),
    (np.array([["ab", "cd"]]), "<U2"),
    (np.ones((2, 3), dtype=np.complex64), "complex64"),
])
def test_npy_non_numeric_dtype_is_refused(tmp_path: Path, array: np.ndarray, dtype_name: str) -> None:
    path = tmp_path / "o.npy"
    np.save(path, array, allow_pickle=True)
    with pytest.raises(InputError, match=rf"dtype {dtype_name}; allowed: bool, int, uint or float"):
        open_input(path, (array.shape[1],))


def test_npy_bool_is_numeric(tmp_path: Path) -> None:
    path = tmp_path / "b.npy"
    np.save(path, np.array([[True, False]]))
    np.testing.assert_array_equal(open_input(path, (2,)).read(0, 1), [[1.0, 0.0]])


# --- .npz -----------------------------------------------------------------------------------------


def test_npz_key_single_and_x(tmp_path: Path) -> None:
    a, b = np.random.rand(5, 3), np.random.rand(7, 3)
    np.savez(tmp_path / "two.npz", X=a, other=b)
    np.savez_compressed(tmp_path / "one.npz", feats=b)
    np.testing.assert_allclose(open_input(tmp_path / "two.npz", (3,)).read(0, 5), a, rtol=1e-6)
    src = open_input(tmp_path / "two.npz", (3,), key="other")
    assert src.count == 7
    np.testing.assert_allclose(src.read(2, 7), b[2:], rtol=1e-6)
    np.testing.assert_allclose(open_input(tmp_path / "one.npz", (3,)).read(0, 7), b, rtol=1e-6)


def test_npz_unknown_key_and_ambiguous(tmp_path: Path) -> None:
    np.savez(tmp_path / "two.npz", a=np.zeros((2, 3)), b=np.zeros((2, 3)))
    with pytest.raises(InputError, match=r"no array 'nope'; available: a, b"):
        open_input(tmp_path / "two.npz", (3,), key="nope")
    with pytest.raises(InputError, match=r"several arrays \(a, b\) and none is named X"):
        count_samples(tmp_path / "two.npz")


def test_npz_truncated(tmp_path: Path) -> None:
    path = tmp_path / "t.npz"
    np.savez(path, X=np.zeros((50, 3)))
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(InputError, match="truncated or corrupt"):
        open_input(path, (3,))


# --- .csv -----------------------------------------------------------------------------------------


def test_csv_with_header(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("a,b,c,d\n1,2,3,4\n5,6,7,8.5\n\n")
    src = open_input(path, (4,))
    assert count_samples(path) == 2 and src.count == 2
    np.testing.assert_array_equal(src.read(0, 2), [[1.0, 2, 3, 4], [5, 6, 7, 8.5]])


def test_csv_without_header_keeps_first_row(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("1,2\n3,4\n")
    np.testing.assert_array_equal(open_input(path, (2,)).read(0, 2), [[1, 2], [3, 4]])


def test_csv_bad_cell_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("x,y\n1,2\n3,oops\n")
    with pytest.raises(InputError, match=rf"input {path} line 3 has a non-numeric value: .*'oops'"):
        open_input(path, (2,))


def test_csv_ragged_row_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("1,2\n3,4,5\n")
    with pytest.raises(InputError, match="line 2 has 3 values, expected 2"):
        open_input(path, (2,))


# --- images -----------------------------------------------------------------------------------------


def test_image_folder_grey_resized_and_sorted(image_dir: Path) -> None:
    src = open_input(image_dir, (1, 8, 8))
    batch = src.read(0, 3)
    assert src.count == 3 and batch.shape == (3, 1, 8, 8) and batch.dtype == np.float32
    # grey of a solid colour is solid; a.PNG (200,0,10) is darker than b.png (0,100,255)
    assert np.ptp(batch[0]) == 0 and np.ptp(batch[1]) == 0
    assert 0 < batch[0, 0, 0, 0] < batch[1, 0, 0, 0] <= 255


def test_image_folder_rgb_chw_unnormalised(image_dir: Path) -> None:
    src = open_input(image_dir, (3, 16, 16))
    batch = src.read(1, 3)
    assert batch.shape == (2, 3, 16, 16)
    for img, colour in zip(batch, COLOURS[1:], strict=True):
        want = np.broadcast_to(np.array(colour, np.float32)[:, None, None], img.shape)
        np.testing.assert_array_equal(img, want)


def test_image_folder_undecodable_file_is_named(image_dir: Path) -> None:
    (image_dir / "bad.jpg").write_bytes(b"not a jpeg")
    src = open_input(image_dir, (3, 8, 8))
    assert src.count == 4
    with pytest.raises(InputError, match=rf"input {image_dir / 'bad.jpg'} is not a whole PNG or JPEG image: "
                       r"it is neither PNG nor JPEG"):
        src.read(0, 4)


@pytest.mark.parametrize("shape", [(64,), (2, 8, 8), (8, 8)])
def test_image_folder_needs_chw_with_1_or_3_channels(image_dir: Path, shape: tuple[int, ...]) -> None:
    with pytest.raises(InputError, match=r"must be \(C, H, W\) with C 1 or 3"):
        open_input(image_dir, shape)


# --- RecordIO -----------------------------------------------------------------------------------------


def test_recordio_reads_images(tmp_path: Path) -> None:
    rec = write_rec(tmp_path, [solid(c, 5, 7) for c in COLOURS])
    src = open_input(rec, (3, 4, 4))
    assert count_samples(rec) == 3 and src.count == 3
    batch = src.read(1, 3)
    assert batch.shape == (2, 3, 4, 4)
    np.testing.assert_array_equal(batch[:, :, 0, 0], np.array(COLOURS[1:], np.float32))
    assert open_input(rec, (1, 4, 4)).read(0, 3).shape == (3, 1, 4, 4)


def test_recordio_missing_idx(tmp_path: Path) -> None:
    rec = write_rec(tmp_path, [solid(COLOURS[0])])
    rec.with_suffix(".idx").unlink()
    with pytest.raises(InputError, match=r"no index data.idx beside it"):
        open_input(rec, (3, 4, 4))
    with pytest.raises(InputError, match="no index"):
        count_samples(rec)


# --- shapes, emptiness, formats -----------------------------------------------------------------------


def test_flat_and_1d_reshape_allowed(tmp_path: Path) -> None:
    digits = np.random.rand(4, 8, 8).astype(np.float32)
    np.save(tmp_path / "d.npy", digits)
    np.testing.assert_array_equal(open_input(tmp_path / "d.npy", (64,)).read(0, 4), digits.reshape(4, 64))
    (tmp_path / "d.csv").write_text("\n".join(",".join(map(str, range(64))) for _ in range(2)))
    batch = open_input(tmp_path / "d.csv", (1, 8, 8)).read(0, 2)
    assert batch.shape == (2, 1, 8, 8) and batch[0, 0, 1, 0] == 8


@pytest.mark.parametrize("data_shape, model_shape", [((3, 8, 8), (1, 8, 8)), ((3, 8, 8), (32,)),
                                                      ((3, 4, 16), (8, 8))])
def test_shape_mismatch_refused(tmp_path: Path, data_shape: tuple, model_shape: tuple) -> None:
    np.save(tmp_path / "x.npy", np.zeros(data_shape))
    want = rf"has samples of shape \({', '.join(map(str, data_shape[1:]))},?\) but model expects"
    with pytest.raises(InputError, match=want):
        open_input(tmp_path / "x.npy", model_shape)


def test_empty_inputs(tmp_path: Path) -> None:
    np.save(tmp_path / "e.npy", np.zeros((0, 64)))
    (tmp_path / "e.csv").write_text("a,b\n")
    (tmp_path / "empty").mkdir()
    cases = [(tmp_path / "e.npy", (64,)), (tmp_path / "e.csv", (2,)), (tmp_path / "empty", (3, 8, 8))]
    for path, shape in cases:
        assert count_samples(path) == 0
        with pytest.raises(InputError, match=rf"input {path} holds no samples"):
            open_input(path, shape)


def test_unknown_suffix_lists_formats(tmp_path: Path) -> None:
    (tmp_path / "x.h5").write_bytes(b"")
    formats = (r"unsupported format; supported: \.npy, \.npz, \.csv, \.parquet, a folder of images "
               r".*\.rec with a sibling")
    with pytest.raises(InputError, match=formats):
        open_input(tmp_path / "x.h5", (3,))


def test_read_out_of_range(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((3, 2)))
    with pytest.raises(IndexError):
        open_input(tmp_path / "x.npy", (2,)).read(2, 4)


def test_count_samples_every_format(tmp_path: Path, image_dir: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros((11, 2)))
    np.savez(tmp_path / "b.npz", X=np.zeros((12, 2)), y=np.zeros(5))
    (tmp_path / "c.csv").write_text("h1,h2\n" + "1,2\n" * 13)
    rec = write_rec(tmp_path, [solid(COLOURS[0])] * 14)
    assert count_samples(tmp_path / "a.npy") == 11
    assert count_samples(tmp_path / "b.npz") == 12
    assert count_samples(tmp_path / "b.npz", key="y") == 5
    assert count_samples(tmp_path / "c.csv") == 13
    assert count_samples(image_dir) == 3
    assert count_samples(rec) == 14


# --- inside_root ----------------------------------------------------------------------------------------


def test_inside_root_relative_and_absolute(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.npy").write_bytes(b"")
    assert inside_root("sub/x.npy", tmp_path) == (tmp_path / "sub" / "x.npy").resolve()
    assert inside_root(tmp_path / "sub" / "x.npy", str(tmp_path)) == (tmp_path / "sub" / "x.npy").resolve()
    with pytest.raises(PathError, match=r"input sub/missing.npy does not exist"):
        inside_root("sub/missing.npy", tmp_path)


def test_inside_root_refuses_dotdot_and_absolute_escape(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret.npy").write_bytes(b"")
    outside = r"input \.\./secret\.npy lies outside the data root .* \(MXQ_DATA_ROOT\)"
    with pytest.raises(PathError, match=outside):
        inside_root("../secret.npy", root)
    with pytest.raises(PathError, match="lies outside the data root"):
        inside_root(tmp_path / "secret.npy", root)


def test_inside_root_refuses_symlink_escape(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "x.npy").write_bytes(b"")
    (root / "link").symlink_to(outside, target_is_directory=True)
    (root / "file.npy").symlink_to(outside / "x.npy")
    for name in ("link/x.npy", "file.npy"):
        with pytest.raises(PathError, match="lies outside the data root"):
            inside_root(name, root)


def test_inside_root_allows_symlinked_root(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "x.csv").write_text("1\n")
    (tmp_path / "alias").symlink_to(real, target_is_directory=True)
    assert inside_root("x.csv", tmp_path / "alias") == (real / "x.csv").resolve()


def test_cli_side_never_imports_mxnet(tmp_path: Path, image_dir: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros((2, 2)))
    code = (
        "import sys; from pathlib import Path; from mxq.tasks.inference.inputs import count_samples\n"
        "from workers.paths import inside_root\n"
        f"p = inside_root('a.npy', {str(tmp_path)!r}); assert count_samples(p) == 2\n"
        f"assert count_samples(Path({str(image_dir)!r})) == 3\n"
        "assert 'mxnet' not in sys.modules, 'mxnet was imported'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_csv_saved_with_a_bom_keeps_its_first_row(tmp_path: Path) -> None:
    """Excel writes a UTF-8 BOM: it once made the first numeric row look like a header."""
    path = tmp_path / "bom.csv"
    path.write_bytes("1,2,3\n4,5,6\n".encode("utf-8-sig"))
    src = open_input(path, (3,))
    assert src.count == count_samples(path) == 2
    assert src.read(0, 2).tolist() == [[1, 2, 3], [4, 5, 6]]


@pytest.mark.parametrize("layout", ["columns", "list", "fixed list", "null list"])
def test_a_parquet_null_names_its_row(tmp_path: Path, layout: str) -> None:
    """The row of the first null, not the start of its row group ("near row 0" for row 99)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows: list[list[float | None] | None] = [[1.0, 2.0] for _ in range(150)]
    if layout == "null list":
        rows[99] = None
    else:
        rows[99] = [1.0, None]
    if layout == "columns":
        table = pa.table({"a": [r[0] for r in rows], "b": [r[1] for r in rows]})  # type: ignore[index]
    else:
        kind = pa.list_(pa.float64(), 2) if layout == "fixed list" else pa.list_(pa.float64())
        table = pa.table({"x": pa.array(rows, kind)})
    path = tmp_path / "nulls.parquet"
    pq.write_table(table, path, row_group_size=40)  # row 99 is the 20th of the third row group
    source = open_input(path, (2,))
    with pytest.raises(InputError, match=r"null (value|row)(: row| in row) 99$"):
        source.read(0, 150)
