"""The parameters each job kind accepts, checked at submit and again by the worker.

One pydantic model per kind: the error names the field, the value and what is allowed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# Upper bounds that keep a typo from asking a device for terabytes.
MAX_BATCH_SIZE = 65536
MAX_TOP_K = 100


class ProbeParams(BaseModel):
    """An environment check: matrix multiply and convolution throughput on one device."""

    model_config = ConfigDict(extra="forbid")

    size: int = Field(1024, ge=16, le=16384, description="Matrix side for the multiply.")
    batch: int = Field(32, ge=1, le=4096, description="Images per convolution batch.")
    repeat: int = Field(5, ge=1, le=10000, description="Timed rounds of each benchmark.")


class InferParams(BaseModel):
    """Bulk inference of one model over one input (or one chunk [start, stop) of it)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field(min_length=1)
    model_version: int | None = Field(None, ge=1)
    input: str = Field(min_length=1)
    key: str | None = Field(None, description="Array name inside an .npz input.")
    batch_size: int = Field(256, ge=1, le=MAX_BATCH_SIZE)
    output: Literal["db", "npy", "both"] = "db"
    top_k: int = Field(0, ge=0, le=MAX_TOP_K)
    reject_nan: bool = False
    chunk_size: int | None = Field(None, ge=1)
    start: int | None = Field(None, ge=0)
    stop: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _range(self) -> InferParams:
        if self.start is not None and self.stop is not None and self.stop <= self.start:
            raise ValueError(f"chunk range [{self.start}, {self.stop}) is empty")
        return self


SPECS: dict[str, type[BaseModel]] = {"probe": ProbeParams, "infer": InferParams}


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
