"""The .csv reader: numbers separated by commas, one sample a line, a non-numeric first line
taken for a header; read whole into float32, naming the line of any bad cell or ragged row."""

from __future__ import annotations

import io

import numpy as np
from numpy.typing import NDArray

from mxq.tasks.inference.inputs.files import InputError, Location, open_binary
from mxq.tasks.inference.inputs.source import Samples


def rows(path: Location) -> list[tuple[int, list[str]]]:
    """(line number, cells) for each non-blank data line; a non-numeric first line is a header."""
    # utf-8-sig: a BOM (Excel writes one) is not part of the first cell, so a numeric first
    # line stays data instead of being taken for a header.
    with io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", errors="replace") as f:
        found = [(n, line.strip().split(",")) for n, line in enumerate(f, 1) if line.strip()]
    return found[1:] if found and not _numeric(found[0][1]) else found


def _numeric(cells: list[str]) -> bool:
    try:
        [float(c) for c in cells]
    except ValueError:
        return False
    return True


def count(path: Location) -> int:
    """The number of samples: its data lines, none of them parsed."""
    return len(rows(path))


def load(path: Location) -> NDArray[np.float32]:
    """The whole CSV as a 2-D float32 array, naming the line of any bad cell or ragged row."""
    data = rows(path)
    width = len(data[0][1]) if data else 0
    out = np.empty((len(data), width), dtype=np.float32)
    for i, (line, cells) in enumerate(data):
        if len(cells) != width:
            raise InputError(f"input {path} line {line} has {len(cells)} values, expected {width}")
        try:
            out[i] = [float(c) for c in cells]
        except ValueError as e:
            raise InputError(f"input {path} line {line} has a non-numeric value: {e}") from e
    return out


def opened(path: Location) -> Samples:
    array = load(path)
    return Samples(array.shape[0], array.shape[1:], lambda start, stop: array[start:stop])
