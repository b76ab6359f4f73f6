"""A model version's registration by a device worker: its parameters, and the `--outputs` a
registration names (one output's kind, or several outputs' names and kinds).
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from mxq.db.records import OUTPUT_KINDS
from mxq.names import NAME_PATTERN
from mxq.status import JobKind
from mxq.workers.jobs.kinds.params import Spec

HEAD_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")  # a file's and a Parquet column's name
MOST_HEADS = 16


def parse_heads(spec: str) -> list[tuple[str, str]] | None:
    """A registration's `--outputs`: None for one output (`auto` or a kind), else each of
    several outputs' (name, kind), in order; ValueError naming what is wrong and what is allowed."""
    kinds = ("auto", *OUTPUT_KINDS)
    if "=" not in spec:
        if spec not in kinds:
            raise ValueError(f"--outputs {spec[:60]!r}: allowed: {', '.join(kinds)}, or "
                             "NAME=KIND,NAME=KIND for a model with several outputs")
        return None
    heads = [tuple(part.strip().partition("=")[::2]) for part in spec.split(",")]
    for name, kind in heads:
        if not HEAD_NAME.match(name) or name in ("index", "labels"):
            raise ValueError(f"--outputs: output name {name[:40]!r}: allowed: a letter, then up to 31 "
                             "letters, digits or _ (not index or labels)")
        if kind not in kinds:
            raise ValueError(f"--outputs: output {name}={kind[:40]!r}: allowed kinds: {', '.join(kinds)}")
    names = [n for n, _ in heads]
    if len(set(names)) != len(names) or not 2 <= len(heads) <= MOST_HEADS:
        raise ValueError(f"--outputs: {len(heads)} outputs named {', '.join(names)[:80]}: allowed: "
                         f"2 to {MOST_HEADS} outputs, each name once")
    return [(n, k) for n, k in heads]


class RegisterParams(Spec):
    """A model version registered by a device worker for a process that cannot load MXNet (a
    GPU build without its driver, as in the compose `api` container; an ONNX-only install):
    `mxq models add` stages the files under $MXQ_HOME/staging and waits for this job."""

    model_config = ConfigDict(extra="forbid")
    job_kind: ClassVar[JobKind] = JobKind.REGISTER

    name: str = Field(pattern=NAME_PATTERN, description="The model name it registers.")
    arch: Literal["mlp", "lenet", "resnet18_v1"] | None = None
    symbol: str | None = Field(None, description="A staged NAME-symbol.json.")
    params: str | None = Field(None, description="A staged NAME-0000.params.")
    onnx: str | None = Field(None, description="A staged plain ONNX file (mxq models add --onnx).")
    input_shape: list[Annotated[int, Field(ge=1, le=2**20)]] | None = Field(None, max_length=8)
    classes: int = Field(10, ge=1, le=2**20)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    preprocess: dict[str, object] | None = None
    outputs: str = Field("auto", max_length=600, description="What the model's output is "
        "(mxq.db.records.OUTPUT_KINDS); auto tells logits from probabilities, and takes an output "
        "of width 1 for regression. A model with several outputs names each, in order: "
        "NAME=KIND[,NAME=KIND...] (KIND may be auto).")

    @field_validator("outputs")
    @classmethod
    def _known_outputs(cls, value: str) -> str:
        parse_heads(value)  # ValueError naming what is wrong
        return value

    @model_validator(mode="after")
    def _one_source(self) -> RegisterParams:
        exported = self.symbol is not None or self.params is not None
        sources = (self.arch is not None) + exported + (self.onnx is not None)
        if sources != 1 or (exported and (self.symbol is None or self.params is None)) or \
                (self.arch is not None and not self.input_shape):
            raise ValueError("give one of arch (with input_shape), both symbol and params, or onnx")
        return self
