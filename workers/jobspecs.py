"""The parameters each job kind accepts, checked at submit and again by the worker.

One pydantic model per kind: the error names the field, the value and what is allowed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ProbeParams(BaseModel):
    """An environment check: matrix multiply and convolution throughput on one device."""

    model_config = ConfigDict(extra="forbid")

    size: int = Field(1024, ge=16, le=16384, description="Matrix side for the multiply.")
    batch: int = Field(32, ge=1, le=4096, description="Images per convolution batch.")
    repeat: int = Field(5, ge=1, le=10000, description="Timed rounds of each benchmark.")


SPECS: dict[str, type[BaseModel]] = {"probe": ProbeParams}


class ParamsError(ValueError):
    """Job parameters that do not fit the kind's spec."""


def validate(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters with defaults filled in, or ParamsError saying what is wrong."""
    spec = SPECS.get(kind)
    if spec is None:
        raise ParamsError(f"unknown job kind {kind!r}; known kinds: {', '.join(SPECS)}")
    try:
        return spec(**params).model_dump()
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or kind}={e.get('input')!r}: {e['msg']}"
            for e in exc.errors()
        )
        raise ParamsError(f"invalid {kind} parameters: {problems}") from None
