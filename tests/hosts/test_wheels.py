"""The NVIDIA wheels' check (`mxq.workers.hardware.wheels`) on distributions laid out as pip lays them out:
a `site-packages` folder of our own with `*.dist-info/RECORD` files and the files they list."""

from __future__ import annotations

from pathlib import Path

from mxq.workers.hardware.wheels import nvidia_wheels, problems


def _wheel(site: Path, name: str, version: str, files: list[str], present: bool = True) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))
    for f in files if present else []:
        (site / f).parent.mkdir(parents=True, exist_ok=True)
        (site / f).write_bytes(b"\x7fELF")


def test_one_extra_alone_has_no_problem(tmp_path: Path) -> None:
    _wheel(tmp_path, "nvidia-curand-cu11", "10.3.0.86", ["nvidia/curand/lib/libcurand.so.10"])
    _wheel(tmp_path, "nvidia-cublas-cu11", "11.11.3.6", ["nvidia/cublas/lib/libcublas.so.11"])
    _wheel(tmp_path, "numpy", "1.23.5", ["numpy/core/x.so"])  # not NVIDIA's: not looked at
    assert [d.metadata["Name"] for d in nvidia_wheels([str(tmp_path)])] == [
        "nvidia-cublas-cu11", "nvidia-curand-cu11"]
    assert problems([str(tmp_path)]) == []


def test_both_extras_in_one_environment_are_named_with_the_fix(tmp_path: Path) -> None:
    shared = "nvidia/curand/lib/libcurand.so.10"
    _wheel(tmp_path, "nvidia-curand-cu11", "10.3.0.86", [shared])
    _wheel(tmp_path, "nvidia-curand-cu12", "10.3.10.19", [shared, "nvidia/curand/lib/x.so.12"])
    (said,) = problems([str(tmp_path)])
    assert said.startswith("the gpu and gpu-onnx extras are installed in one environment: "
                           f"nvidia-curand-cu11 and nvidia-curand-cu12 both own {shared} (1 files "
                           "are owned twice)")
    assert "set MXQ_ONNX_PYTHON" not in said and "point MXQ_ONNX_PYTHON at its python" in said


def test_a_library_another_wheel_took_with_it_is_named_with_the_reinstall(tmp_path: Path) -> None:
    """After `pip uninstall nvidia-curand-cu12` the cu11 copy was gone too, and `pip check` said
    nothing was broken."""
    _wheel(tmp_path, "nvidia-curand-cu11", "10.3.0.86", ["nvidia/curand/lib/libcurand.so.10"],
           present=False)
    assert problems([str(tmp_path)]) == [
        "nvidia/curand/lib/libcurand.so.10 of nvidia-curand-cu11 10.3.0.86 is missing (removed "
        "with another wheel that shared it?): pip install --force-reinstall --no-deps "
        "nvidia-curand-cu11==10.3.0.86"]


def test_a_file_every_owner_ships_the_same_is_no_problem(tmp_path: Path) -> None:
    """Each nvidia-*-cu11 wheel ships the same empty `nvidia/__init__.py`."""
    for name in ("nvidia-curand-cu11", "nvidia-cufft-cu11"):
        info = tmp_path / f"{name.replace('-', '_')}-1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1\n")
        (info / "RECORD").write_text("nvidia/__init__.py,sha256=47DEQpj8HBSa,0\n")
    assert problems([str(tmp_path)]) == []
