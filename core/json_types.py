"""JSON as Python holds it once parsed: the type of stored job parameters, API bodies, webhook
payloads and event facets, where `Any` would let any value through unchecked.

`JsonValue` is recursive: a list or object holds JSON again. Parameters take `JsonMapping`
(read-only, so a `dict[str, int]` is one too); builders return `JsonObject`. The aliases are
`TypeAliasType`s, not plain recursive aliases, because pydantic (the API's answers, the records'
TypedDicts) resolves only those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from typing_extensions import TypeAliasType

JsonScalar = str | int | float | bool | None
JsonValue = TypeAliasType("JsonValue", "JsonScalar | list[JsonValue] | dict[str, JsonValue]")
JsonObject = TypeAliasType("JsonObject", "dict[str, JsonValue]")
# Read-only views, for parameters: Mapping and Sequence are covariant, dict and list are not.
JsonReadable = TypeAliasType(
    "JsonReadable", "JsonScalar | Sequence[JsonReadable] | Mapping[str, JsonReadable]")
JsonMapping = TypeAliasType("JsonMapping", "Mapping[str, JsonReadable]")
