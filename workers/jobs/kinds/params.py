"""What every job kind's parameters share: the time limit, the limits read from the settings,
the error a wrong parameter raises, and the two places parameters cross JSON: validated from it
(at the edge, and where a worker reads a stored job) and dumped to it (where SQL stores them).

One pydantic model per kind (workers/jobs/kinds/: probe.py, infer.py, train.py, register.py, arch.py):
the error names the field, the value and what is allowed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, WithJsonSchema, field_validator
from pydantic_core import ErrorDetails, PydanticCustomError

from mxq.errors import UserError
from mxq.json_types import JsonMapping, JsonObject, JsonReadable
from mxq.names import shown
from mxq.since import MAX_TIME_LIMIT, TIME_LIMIT_EXAMPLES, TIME_LIMIT_PATTERN, DurationError, parse_time_limit
from mxq.status import JobKind
from mxq.workers.settings import Limits, get_settings

# The lower precisions a version may have, as `mxq.engines.VARIANTS` names them.
Variant = Literal["int8", "fp16"]


def at_most(value: int, info: ValidationInfo, setting: str) -> int:
    """`value` if it is within the MXQ_<SETTING> limit (from the validation context, else the
    process settings), or the same error pydantic gives for `le`, naming the setting."""
    limit = (info.context or {}).get(setting) or getattr(get_settings().limits, setting)
    if value > limit:
        raise PydanticCustomError("less_than_equal",
                                  "Input should be less than or equal to {le} (MXQ_{setting})",
                                  {"le": limit, "setting": setting.upper()})
    return value


# What the API's schema says `time_limit` is: seconds, or a duration string the validator reads.
_TIME_LIMIT_SCHEMA = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_TIME_LIMIT},
                                {"type": "string", "pattern": TIME_LIMIT_PATTERN}, {"type": "null"}]}




class Spec(BaseModel):
    """One kind's parameters: `job_kind` names the kind (its task is `mxq.<kind>`)."""

    job_kind: ClassVar[JobKind]


class TimeLimited(Spec):
    """What every job a user submits may carry: `time_limit`, the seconds it may run, counted
    from its first start across its attempts (its parent's, for a chunk or a node's part). Past
    it, the job stops at its next checkpoint, keeps what it committed, and fails naming the limit
    (`mxq.tasks.runner.JobTimedOut`)."""

    time_limit: Annotated[int | None, WithJsonSchema(_TIME_LIMIT_SCHEMA)] = Field(
        None, ge=1, le=MAX_TIME_LIMIT, description="The most it may run, in seconds or as a "
        "duration (90s, 45m, 2h, 1h30m), counted from its first start across attempts; past it "
        "the job stops at its next checkpoint (a committed flush, an epoch's checkpoint), keeps "
        "what it committed and fails naming the limit. Unset: no limit.")

    @field_validator("time_limit", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        if not isinstance(value, str):
            return value  # seconds: pydantic's own checks name what is wrong with them
        try:
            return parse_time_limit(value)
        except DurationError:
            raise PydanticCustomError("duration", f"expected {TIME_LIMIT_EXAMPLES}") from None



class ParamsError(UserError):
    """Job parameters that do not fit the kind's spec."""


def _has_nul(value: object) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list | tuple):
        return any(map(_has_nul, value))
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    return False


def _check_no_nul(kind: JobKind, items: Iterable[tuple[str, object]]) -> None:
    for key, value in items:
        if _has_nul(key) or _has_nul(value):
            where = f"{key}={value!r}".replace("\x00", "\\x00")
            raise ParamsError(f"invalid {kind} parameters: {where}: NUL characters are not allowed")


def check_no_nul(kind: JobKind, values: JsonMapping) -> None:
    """ParamsError naming the first value with a NUL character: PostgreSQL cannot store one,
    and no path or name has one."""
    _check_no_nul(kind, values.items())


def check_model_no_nul(p: Spec) -> None:
    """`check_no_nul` of a typed request's fields (the API's body, a CLI command's request)."""
    _check_no_nul(p.job_kind, fields_of(p).items())


def fields_of(p: BaseModel) -> dict[str, object]:
    """A model's fields and their values, as Python holds them (not JSON)."""
    return {name: getattr(p, name) for name in type(p).model_fields}


def _problem(e: ErrorDetails) -> str:
    """`field=value: what is allowed` for one error; a check across fields (no `loc`) names its
    own fields and values, so it is shown alone, not after the whole parameter dict."""
    if not e["loc"]:
        return str(e["msg"]).removeprefix("Value error, ")
    return f"{'.'.join(map(str, e['loc']))}={shown(e.get('input'))}: {e['msg']}"


P = TypeVar("P", bound=Spec)  # one kind's parameters (a `jobspecs.SPECS` entry)


def params_error(kind: JobKind, exc: ValidationError) -> ParamsError:
    """A kind's wrong parameters in one line: each wrong field, its value and what is allowed."""
    return ParamsError(f"invalid {kind} parameters: {'; '.join(map(_problem, exc.errors()))}")


def validated(spec: type[P], params: JsonMapping, limits: Limits | None = None) -> P:
    """`params` as a `spec`, or ParamsError naming each wrong field, its value and what is
    allowed (checked at the edge, and again where a worker reads a stored job). Size limits
    come from `limits` (default: the process settings')."""
    check_no_nul(spec.job_kind, params)
    context = {"max_batch_size": limits.max_batch_size, "max_epochs": limits.max_epochs,
               "max_probe_gflop": limits.max_probe_gflop} if limits is not None else None
    try:
        return spec.model_validate(params, context=context)
    except ValidationError as exc:
        raise params_error(spec.job_kind, exc) from None


@dataclass(frozen=True)
class Rejected:
    """A request that could not be read as its kind's model (`requested`): its kind, its options
    as given, and why, in one line. A submit records it as a failed job, as it does wrong inputs,
    so the history says why."""

    kind: JobKind
    given: JsonMapping
    reason: str


def requested(spec: type[P], **fields: JsonReadable) -> P | Rejected:
    """A CLI command's options as its kind's request (the model the API validates, within the
    process settings' limits), or the Rejected request its submit records as a failed job."""
    try:
        check_no_nul(spec.job_kind, fields)
        return spec(**fields)
    except ValidationError as exc:
        return Rejected(spec.job_kind, fields, str(params_error(spec.job_kind, exc)))
    except ParamsError as exc:
        return Rejected(spec.job_kind, fields, str(exc))


def stored(params: Spec) -> JsonObject:
    """The parameters as SQL stores them (JSON): the one place a typed job becomes a dict."""
    return params.model_dump(mode="json")
