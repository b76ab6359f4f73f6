"""An architecture's trial: the parameters of the job that tries a user's architecture code
before it is registered, and the bounds of an architecture's name, file and factory.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import ConfigDict, Field, field_validator

from mxq.names import NAME_PATTERN
from mxq.status import JobKind
from mxq.workers.jobs.kinds.params import Spec

ARCHS = ("mlp", "lenet", "resnet18_v1")  # the built-in architectures (tasks/model_store/zoo.py builds them)
MAX_ARCH_NAME = 64  # a registered architecture's name (it is a model version's `arch`)
MAX_ARCH_BYTES = 1 << 20  # an architecture's Python file
SHA256_PATTERN = r"^[0-9a-f]{64}$"
FACTORY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"  # a Python function name


class ArchParams(Spec):
    """The trial of an architecture's code before it is registered (`mxq arch add`, `POST
    /archs`): a device worker imports the staged file in a child process of its own, builds the
    net with the factory, forwards random samples and, when the output is (N, classes), stores
    the file by its checksum and registers the next version of the name. Set by mxq, never by a
    job request (the API's job schema has no such kind)."""

    model_config = ConfigDict(extra="forbid")
    job_kind: ClassVar[JobKind] = JobKind.ARCH

    name: str = Field(pattern=NAME_PATTERN, max_length=MAX_ARCH_NAME)
    file: str = Field(min_length=1, description="The staged file, under $MXQ_HOME/staging.")
    file_name: str = Field(min_length=1, max_length=256, description="Its name as given.")
    factory: str = Field(pattern=FACTORY_PATTERN)
    classes: int = Field(10, ge=2, le=2**20)
    input_shape: list[Annotated[int, Field(ge=1, le=2**16)]] = Field(min_length=1, max_length=8)
    added_by: str | None = Field(None, max_length=128)

    @field_validator("name")
    @classmethod
    def _not_builtin(cls, value: str) -> str:
        if value in ARCHS:
            raise ValueError(f"{value} is a built-in architecture: give your own a name of its own")
        return value
