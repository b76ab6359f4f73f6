"""JSON as Python holds it once parsed: the type of stored job parameters, API bodies, webhook
payloads and event facets, where `Any` would let any value through unchecked.

`JsonValue` is recursive: a list or object holds JSON again. Parameters take `JsonMapping`
(read-only, so a `dict[str, int]` is one too); builders return `JsonObject`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

JsonScalar: TypeAlias = str | int | float | bool | None
JsonValue: TypeAlias = JsonScalar | list["JsonValue"] | dict[str, "JsonValue"]
JsonObject: TypeAlias = dict[str, JsonValue]
# Read-only views, for parameters: Mapping and Sequence are covariant, dict and list are not.
JsonMapping: TypeAlias = Mapping[str, "JsonReadable"]
JsonReadable: TypeAlias = JsonScalar | Sequence["JsonReadable"] | Mapping[str, "JsonReadable"]
