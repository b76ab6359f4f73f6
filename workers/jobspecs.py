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


ARCHS = ("mlp", "lenet", "resnet18_v1")  # the built-in architectures (tasks/zoo.py builds them)
MAX_EPOCHS = 10000
MAX_DEVICES = 64


class TrainParams(BaseModel):
    """Data-parallel training of a built-in architecture on one node's devices."""

    model_config = ConfigDict(extra="forbid")

    arch: Literal["mlp", "lenet", "resnet18_v1"]
    dataset: str = Field(min_length=1)
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$")
    devices: int = Field(1, ge=1, le=MAX_DEVICES)
    device_list: list[str] | None = None
    epochs: int = Field(10, ge=1, le=MAX_EPOCHS)
    batch_size: int = Field(64, ge=1, le=MAX_BATCH_SIZE)
    lr: float = Field(0.1, gt=0, le=100, allow_inf_nan=False)
    optimizer: Literal["sgd", "adam", "nag"] = "sgd"
    dtype: Literal["float32", "float16"] = "float32"
    val_fraction: float = Field(0.2, ge=0, lt=1)
    seed: int = 0
    label_column: str = "label"
    input_shape: list[int] | None = Field(None, description="Image datasets: C,H,W to resize to.")
    fire_id: int | None = Field(None, description="The schedule fire that started this job.")

    @model_validator(mode="after")
    def _devices_agree(self) -> TrainParams:
        if self.device_list:
            if len(set(self.device_list)) != len(self.device_list):
                raise ValueError(f"--device lists a device twice: {','.join(self.device_list)}")
            if len({d.split(":")[0] for d in self.device_list}) != 1:
                raise ValueError("--device must list devices of one kind, e.g. gpu:0,gpu:1")
            self.devices = len(self.device_list)
        return self


SPECS: dict[str, type[BaseModel]] = {"probe": ProbeParams, "infer": InferParams, "train": TrainParams}


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
