"""`mxq models`: list, add (built-in or exported) and promote model versions."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer
from typer.core import TyperGroup

from mxq.cli import render
from mxq.cli.options import LayoutOpt, MeanOpt, ScaleOpt, StdOpt
from mxq.cli.settings import get_settings
from mxq.errors import UserError, reason
from mxq.json_types import JsonObject
from mxq.names import MAX_ID

if TYPE_CHECKING:
    from mxq.db.records import ModelRecord
    from mxq.workers.jobs.jobspecs import RegisterParams


class _NameMeansShow(TyperGroup):
    """`mxq models NAME` reads as `mxq models show NAME`."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            args = ["show", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(help="The model registry: `mxq models [NAME] [--json]`, `add`, `promote`.",
                  cls=_NameMeansShow, invoke_without_command=True, no_args_is_help=False)
COLUMNS = ["name", "version", "arch", "input_shape", "classes", "outputs", "preprocess", "promoted",
           "source", "created_at"]


class ShapeError(UserError):
    """An --input-shape that is not a list of positive integers."""


class OutputsError(UserError):
    """An --outputs that is not auto, logits or probabilities, or does not fit a built-in."""


# --outputs: auto, and what a version may output (mxq.db.records.OUTPUT_KINDS, not imported here:
# the CLI's modules stay light)
OUTPUTS = ("auto", "logits", "probabilities", "multilabel", "regression", "embedding")


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        dims = tuple(int(p) for p in text.replace("x", ",").split(","))
    except ValueError:
        raise ShapeError(f"--input-shape {text!r}: expected sizes of one sample such as 64 or "
                         "1,8,8") from None
    if not dims or min(dims) < 1:
        raise ShapeError(f"--input-shape {text!r}: every size must be a positive integer")
    return dims


def describe(stored: JsonObject) -> str:
    """A version's preprocessing in one short line: `x*0.00392 -0.5 /0.25 NCHW`, or `none`."""
    from mxq.preprocess import Preprocess  # NumPy: imported by the commands that show versions

    return Preprocess.from_dict(stored).describe()


def _list(name: str | None, json_: bool) -> None:
    from mxq.db.registry import list_models

    rows = list_models(get_settings().database, name)
    if json_:
        render.print_json(rows)
    else:
        render.table([{**r, "preprocess": describe(r["preprocess"])} for r in rows], COLUMNS, "models")


@app.callback()
def models(ctx: typer.Context, json_: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List every model version."""
    if ctx.invoked_subcommand is None:
        _list(None, json_)


@app.command()
def show(name: str, json_: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The versions of NAME with their metrics."""
    from mxq.db.registry import resolve

    resolve(get_settings().database, name)  # an unknown name is an error, not an empty list
    _list(name, json_)


@app.command()
def add(name: str,
        arch: Annotated[str | None, typer.Option(help="Built-in: mlp, lenet, resnet18_v1.")] = None,
        symbol: Annotated[str | None, typer.Option(help="NAME-symbol.json from net.export(): a path, or s3://BUCKET/KEY inside MXQ_S3_ALLOWED.")] = None,  # noqa: E501
        params: Annotated[str | None, typer.Option(help="NAME-0000.params from net.export(): a path, or s3://BUCKET/KEY inside MXQ_S3_ALLOWED.")] = None,  # noqa: E501
        onnx: Annotated[str | None, typer.Option(help="A plain ONNX file made elsewhere (torch.onnx.export, skl2onnx): a path, or s3://BUCKET/KEY inside MXQ_S3_ALLOWED; served by ONNX Runtime only.")] = None,  # noqa: E501
        input_shape: Annotated[str | None, typer.Option(help="One sample's shape: 64 or 1,8,8.")] = None,
        classes: Annotated[int, typer.Option(help="Output classes of a built-in architecture.")] = 10,
        seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
        scale: ScaleOpt = None, mean: MeanOpt = None, std: StdOpt = None, layout: LayoutOpt = None,
        outputs: Annotated[str, typer.Option(help="What an exported model outputs: auto (detect: a last softmax op, or rows summing to 1; an output of width 1 is regression), logits (mxq applies a softmax), probabilities, multilabel (independent label probabilities in [0, 1]), regression (values) or embedding (a vector per sample); a model with several outputs names each in order: NAME=KIND,NAME=KIND.")] = "auto",  # noqa: E501
        owner: Annotated[str | None, typer.Option(help="A new model's owner (a user): it registers and promotes its versions. Default: the admins alone.")] = None,  # noqa: E501
        team: Annotated[str | None, typer.Option(help="A new model's team: its members (role submit) register and promote its versions too.")] = None,  # noqa: E501
        json_: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Add a version of NAME: a built-in architecture (--arch), an exported model (--symbol/--params)
    or a plain ONNX file (--onnx).

    The worker feeds it (x * scale - mean) / std; with none given, inputs as they are stored.
    A new model may be given an owner and a team at once (`mxq models share` changes them)."""
    from mxq.names import check_name
    from mxq.preprocess import Preprocess
    from mxq.workers.jobs.jobspecs import RegisterParams, validated

    check_name(name)  # refused before MXNet is even loaded, as bad preprocessing is
    prep = Preprocess.parse(scale, mean, std, layout)
    _check_outputs(outputs)
    shape = parse_shape(input_shape)
    _check_sources(arch, symbol, params, onnx, outputs, shape)
    with fetched_files(symbol, params, onnx) as (symbol_file, params_file, onnx_file):
        request = validated(RegisterParams, {
            "name": name, "arch": arch, "symbol": _text(symbol_file), "params": _text(params_file),
            "onnx": _text(onnx_file), "input_shape": list(shape) if shape else None,
            "classes": classes, "seed": seed, "preprocess": prep.as_dict(), "outputs": outputs})
        record = _register(request)
    if owner is not None or team is not None:
        record = _shared(record, owner, team)
    if json_:
        render.print_json(record)
    else:
        render.out.print(_added(record))


def _check_outputs(outputs: str) -> None:
    """--outputs: one kind for the whole output, or NAME=KIND for each of several outputs."""
    if outputs not in OUTPUTS and "=" not in outputs:
        raise OutputsError(f"--outputs {outputs!r}: allowed: {', '.join(OUTPUTS)}, or NAME=KIND,… "
                           "for a model with several outputs")


def _check_sources(arch: str | None, symbol: str | None, params: str | None, onnx: str | None,
                   outputs: str, shape: tuple[int, ...] | None) -> None:
    """The options name one source of the model (a built-in, an export's two files, or an ONNX
    file), refused before MXNet loads when they do not."""
    if onnx is not None:
        if any((arch, symbol, params)):
            raise ShapeError("--onnx goes alone: give one of --arch, --symbol/--params or --onnx")
    elif arch and not any((symbol, params)):
        _check_builtin(outputs, shape)
    elif not all((symbol, params, not arch)):
        raise ShapeError("give either --arch (with --input-shape, --classes), both --symbol and "
                         "--params, or --onnx")


def _check_builtin(outputs: str, shape: tuple[int, ...] | None) -> None:
    """A built-in architecture outputs logits, and needs the shape of its samples."""
    if outputs not in ("auto", "logits"):
        raise OutputsError(f"--outputs {outputs}: a built-in architecture outputs logits; "
                           "allowed with --arch: auto or logits")
    if shape is None:
        raise ShapeError("--input-shape is needed with --arch (e.g. 64 for mlp, 1,8,8 for lenet)")


def _text(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _register(request: RegisterParams) -> ModelRecord:
    """The version registered here, or by a device worker when this process cannot load MXNet."""
    try:
        from mxq.tasks.model_store.add import add_version  # loads MXNet: only for this command
    except ImportError as exc:  # a GPU build without its driver, an ONNX-only install
        return register_on_a_worker(request, reason(exc))
    return add_version(get_settings(), request)


def _added(record: ModelRecord) -> str:
    """The version just added, in one line."""
    return (f"added {record['name']}:{record['version']} ({record['arch']}, input "
            f"{tuple(record['input_shape'])}, {_width(record)}, "
            f"outputs {record['outputs']}, preprocessing {describe(record['preprocess'])})")


def _width(record: ModelRecord) -> str:
    """What the version's output width is, in words: classes, labels or values."""
    words = {"multilabel": "labels", "regression": "values", "embedding": "dimensions"}
    heads = record.get("heads")
    if heads:
        return "outputs " + ", ".join(f"{h['name']} ({h['width']} {h['kind']})" for h in heads)
    return f"{record['classes']} {words.get(record['outputs'], 'classes')}"


def _shared(record: ModelRecord, owner: str | None, team: str | None) -> ModelRecord:
    """The version just added, with its model's new owner and team (a new model only: an
    existing one keeps its own, and says how to change it)."""
    from mxq.db.registry import resolve, share

    if record["version"] != 1:
        raise OwnershipError(f"model {record['name']} exists already (this is version "
                             f"{record['version']}, added): --owner and --team name a new model's; "
                             f"`mxq models share {record['name']}` changes them")
    url = get_settings().database
    share(url, record["name"], owner, team)
    return resolve(url, record["name"], record["version"])


class OwnershipError(UserError):
    """--owner or --team given for a model that exists already."""


@contextlib.contextmanager
def fetched_files(*given: str | None) -> Iterator[list[Path | None]]:
    """The model files as local paths: an `s3://` one (inside MXQ_S3_ALLOWED) downloaded into a
    folder of $MXQ_HOME/staging for the registration, and removed after it."""
    import shutil
    import uuid

    from mxq.objects import is_object_url
    from mxq.workers.paths import staging_dir
    from mxq.workers.storage.client import download
    from mxq.workers.storage.locate import allowed_url

    s = get_settings()
    folder = staging_dir(s.home_path) / uuid.uuid4().hex
    found: list[Path | None] = []
    try:
        for text in given:
            if text is None or not is_object_url(text):
                found.append(None if text is None else Path(text))
                continue
            url = allowed_url(s, text, "model file")
            folder.mkdir(parents=True, exist_ok=True)
            found.append(folder / url.key.rsplit("/", 1)[-1])
            download(s, url, str(found[-1]))
        yield found
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def register_on_a_worker(r: RegisterParams, why: str) -> ModelRecord:
    """Registration by a worker whose device MXNet runs (the `register` job), for a process that
    cannot load MXNet (`why`): the files staged under $MXQ_HOME/staging, the job awaited."""
    import shutil
    import uuid

    from mxq.db.reports.history import require_job
    from mxq.workers.jobs.submit import submit
    from mxq.workers.paths import staging_dir

    s = get_settings()
    folder = staging_dir(s.home_path) / uuid.uuid4().hex
    files = [(k, path) for k in ("symbol", "params", "onnx") if (path := getattr(r, k)) is not None]
    if files:
        folder.mkdir(parents=True)
        r = r.model_copy(update={k: str(shutil.copyfile(path, folder / Path(path).name))
                                 for k, path in files})
    render.err.print(f"mxq: this process cannot load MXNet ({why}); a worker whose device runs "
                     "it registers the model", markup=False, soft_wrap=True)
    try:
        job_id = submit(s, r.job_kind, r)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    render.wait_for(job_id, lambda i: require_job(s.database, i), None)
    job = require_job(s.database, job_id)
    if job["status"] != "succeeded" or job["result"] is None:
        raise RegistrationFailed(f"registration job {job_id} {job['status']}: {job['error']}")
    return cast("ModelRecord", job["result"]["model"])  # the version the worker stored


class RegistrationFailed(UserError):
    """The worker that registered the model refused it; the message is its job's error."""


@app.command("promote")
def promote_cmd(name: str, version: Annotated[int, typer.Argument(min=1, max=MAX_ID)]) -> None:
    """Make VERSION the one `mxq infer NAME` uses."""
    from mxq.db.registry import promote

    record = promote(get_settings().database, name, version)
    render.out.print(f"{record['name']}:{record['version']} is promoted")


@app.command("share")
def share_cmd(name: str,
              owner: Annotated[str | None, typer.Option(help="The user who owns it: registers and "
                                                        "promotes its versions.")] = None,
              team: Annotated[str | None, typer.Option(help="Its team: its members (role submit) "
                                                       "register and promote versions too.")] = None,
              private: Annotated[bool, typer.Option("--no-team", help="Share with no team.")] = False,
              ) -> None:
    """Give model NAME an owner and a team (a model without an owner, as every model added
    here, is the admins' alone)."""
    from mxq.db.registry import share

    if owner is None and team is None and not private:
        raise typer.BadParameter("nothing to change: give --owner USER, --team TEAM or --no-team")
    owned = share(get_settings().database, name, owner, None if private else team, private)
    render.out.print(f"model {name}: owner {owned[0] or '(admins)'}, team {owned[1] or '(none)'}",
                     highlight=False)


class QuantizeError(UserError):
    """A --samples or --min-agreement out of range for `mxq models quantize`."""


@app.command()
def quantize(model: Annotated[str, typer.Argument(help="NAME or NAME:VERSION (default: the promoted one, else the newest).")],  # noqa: E501
             calibration: Annotated[str, typer.Option(help="Samples of your own data: digits, .npz (X, y), .csv with a label column (labels give accuracy), or any mxq infer input (.npy, .parquet, ...); a path inside MXQ_DATA_ROOT or s3://BUCKET/KEY.")],  # noqa: E501
             samples: Annotated[int, typer.Option(help="Samples to calibrate on; a quarter of the file (at most 2,048) is held out to check the variant.")] = 256,  # noqa: E501
             key: Annotated[str | None, typer.Option(help="Array name inside an .npz without X and y.")] = None,  # noqa: E501
             min_agreement: Annotated[float | None, typer.Option(help="Let jobs that set no --precision run the variant within this agreement (as --precision auto --min-agreement).")] = None,  # noqa: E501
             precision: Annotated[str, typer.Option(help="int8 (static quantization, calibrated on --samples) or fp16 (float16 weights and operators, for GPUs).")] = "int8",  # noqa: E501
             json_: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Build a lower-precision variant of a version (int8, calibrated on --calibration; or fp16),
    check it against float32 on held-out samples of --calibration (argmax agreement, max
    probability difference, accuracy with labels) and store it."""
    from mxq.db.registry import resolve
    from mxq.engines import VARIANTS
    from mxq.tasks.model_store.variants import build_variant
    from mxq.tasks.training import calibration as calibration_data

    if precision not in VARIANTS:
        raise QuantizeError(f"--precision {precision!r}: allowed {', '.join(VARIANTS)}")
    if not 1 <= samples <= 100_000:
        raise QuantizeError(f"--samples {samples}: allowed 1 to 100000")
    if min_agreement is not None and not 0.0 <= min_agreement <= 1.0:
        raise QuantizeError(f"--min-agreement {min_agreement}: allowed 0 to 1 (e.g. 0.99)")
    s = get_settings()
    name, _, version = model.partition(":")
    if version and not version.isdigit():
        raise QuantizeError(f"model version {version!r} in {model!r} must be a number, as in NAME:3")
    record = resolve(s.database, name, int(version) if version else None)
    data = calibration_data.load(s, calibration, record, key)
    record = build_variant(s, record, precision, data, samples, min_agreement)
    variant = record["variants"][precision]
    if json_:
        render.print_json(variant)
        return
    render.out.print(variant_line(record, precision), markup=False, soft_wrap=True)


def variant_line(record: ModelRecord, precision: str) -> str:
    """The `precision` variant of a version and its checks, in one line."""
    v = record["variants"][precision]
    accuracy = v.get("accuracy")
    parts = [f"{precision} variant of {record['name']}:{record['version']}: argmax agreement "
             f"{v['agreement']:.2%} with float32 on {v['held_out']} held-out samples",
             f"max probability difference {v['max_diff']:.3g}"]
    if accuracy:
        parts.append(f"accuracy {accuracy[precision]:.2%} (float32 {accuracy['fp32']:.2%})")
    if v["calibration"]["samples"]:
        parts.append(f"calibrated on {v['calibration']['samples']} samples of "
                     f"{v['calibration']['source']}")
    if v.get("bound") is not None:
        parts.append(f"jobs with no --precision run it within agreement {v['bound']:.2%}")
    return "; ".join(parts)
