"""The API's JSON answers checked against the shapes it documents (an object, a list of
objects, a number), so that the client hands on typed JSON and a proxy's odd answer is an
MxqError that says what came, not a TypeError somewhere later.

Imports (of mxq): core.
"""

from __future__ import annotations

from mxq.errors import MxqError
from mxq.json_types import JsonObject, JsonValue


def json_object(value: JsonValue) -> JsonObject:
    """An answer the API documents as one JSON object."""
    if not isinstance(value, dict):
        raise MxqError(f"the mxq API answered {type(value).__name__}, expected an object")
    return value


def json_objects(value: JsonValue) -> list[JsonObject]:
    """An answer (or an answer's `items`) the API documents as a list of JSON objects."""
    if not isinstance(value, list):
        raise MxqError(f"the mxq API answered {type(value).__name__}, expected a list")
    return [json_object(item) for item in value]


def json_int(value: JsonValue) -> int:
    """A field the API documents as a number."""
    if not isinstance(value, int | float | str):
        raise MxqError(f"the mxq API answered {value!r}, expected a number")
    return int(value)
