"""The .npz reader: the array named by the input key (else the only one, else `X`), its shape and
size read from its header, loaded whole on the first read: zipped members cannot be mapped."""

from __future__ import annotations

import zipfile

import numpy as np
from numpy.typing import NDArray

from mxq.tasks.inference.inputs.files import InputError, Location, open_binary
from mxq.tasks.inference.inputs.limits import Limits
from mxq.tasks.inference.inputs.npy import read_header
from mxq.tasks.inference.inputs.source import Fetch, Samples

LISTED_NAMES = 10  # an error lists this many of an .npz's arrays, then how many there are


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:LISTED_NAMES]) or "none"
    return shown if len(names) <= LISTED_NAMES else f"{shown}, … ({len(names)} arrays)"


def _chosen(path: Location, names: list[str], key: str | None) -> str:
    """The member to read: `key`, the only one, else `X`."""
    if key is not None:
        if key not in names:
            raise InputError(f"input {path} has no array {key!r}; available: {_names(names)}")
        return key
    if len(names) == 1:
        return names[0]
    if "X" in names:
        return "X"
    raise InputError(f"input {path} holds several arrays ({_names(names)}) "
                     "and none is named X; choose one with the input key")


def member(path: Location, key: str | None, limits: Limits | None = None) -> tuple[str, tuple[int, ...]]:
    """Pick the array (`key`, the only one, else `X`) and read its shape from its header only;
    with `limits`, refuse one that would decompress past them."""
    try:
        with open_binary(path, headers_only=True) as raw, zipfile.ZipFile(raw) as zf:
            chosen = _chosen(path, [n.removesuffix(".npy") for n in zf.namelist()], key)
            with zf.open(chosen + ".npy") as f:
                shape, _fortran, dtype = read_header(f, path)
            if limits is not None:
                limits.check_bytes(path, f"array {chosen!r} ", shape, dtype)
                unpacked = zf.getinfo(chosen + ".npy").file_size
                if unpacked > limits.max_bytes:
                    raise InputError(f"input {path} array {chosen!r} unpacks to {unpacked:,} bytes, more "
                                     f"than the {limits.max_bytes:,} allowed (MXQ_MAX_INPUT_BYTES)")
    except (zipfile.BadZipFile, EOFError, OSError, KeyError) as e:
        raise InputError(f"input {path} is truncated or corrupt: {e}") from e
    return chosen, shape


def count(path: Location, key: str | None = None) -> int:
    """The number of samples of the chosen array, from its header alone."""
    return member(path, key)[1][0]


def _batches(path: Location, key: str) -> Fetch:
    """The member is loaded on the first read: members are zipped, so they can't be memory-mapped."""
    cache: dict[str, NDArray[np.generic]] = {}

    def fetch(start: int, stop: int) -> NDArray[np.generic]:
        if key not in cache:
            try:
                with open_binary(path) as raw, np.load(raw) as npz:
                    cache[key] = npz[key]
            except (ValueError, EOFError, OSError, zipfile.BadZipFile) as e:
                raise InputError(f"input {path} is truncated or corrupt: {e}") from e
        return cache[key][start:stop]

    return fetch


def opened(path: Location, key: str | None, limits: Limits) -> Samples:
    chosen, shape = member(path, key, limits)
    return Samples(shape[0], shape[1:], _batches(path, chosen))
