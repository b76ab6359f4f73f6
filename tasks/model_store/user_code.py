"""Your own architecture's code (`mxq arch add`): imported, built and checked, only ever in a child
process of a device worker (the `arch` job's trial, `python -m mxq.tasks.model_store.user_code`,
and the training child), never in the API, the CLI or a worker's own process.

The code is one Python file defining a factory

    def FACTORY(classes: int, input_shape: tuple[int, ...]) -> mxnet.gluon.HybridBlock

called with the number of classes and one sample's shape (C,H,W for images, (features,) for a
table), and returning the net uninitialized: mxq initializes it (Xavier, seeded), trains it as
the built-ins and exports it. The net outputs logits, one row of `classes` per sample.

The file is imported by path under a module name of its own (`mxq_arch_<sha256[:12]>`) from its
stored copy, whose checksum is checked first. Whatever goes wrong in it is one line that starts
`arch NAME:` (`CodeError`): refused at registration, the training's error at training time.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mxq.errors import UserError, typed_line
from mxq.tasks.runtimes.mx import gluon, mx

TRIAL_SAMPLES = 4  # random samples the trial forwards
TRIAL_INPUT_ERROR = 3  # the trial child's exit status for code it refused (its report says why)


class CodeError(UserError):
    """An architecture's code that does not import, build, or give (N, classes): one line."""


def load_factory(path: Path, sha256: str, name: str, factory: str, shown: str) -> Callable[..., Any]:
    """The factory of the file at `path` (`shown`: its name as given), imported as a module of
    its own."""
    module_name = f"mxq_arch_{sha256[:12]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise CodeError(f"arch {name}: {shown} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # user code: whatever it raises is its own problem
        raise CodeError(f"arch {name}: importing {shown} raised {typed_line(exc, 300)}") from None
    found = getattr(module, factory, None)
    if not callable(found):
        raise CodeError(f"arch {name}: {shown} has no function {factory}")
    return found  # type: ignore[no-any-return]  # user code: checked callable


def build(path: Path, sha256: str, name: str, factory: str, shown: str, classes: int,
          input_shape: tuple[int, ...]) -> gluon.HybridBlock:
    """The net the factory builds for `classes` and `input_shape`, uninitialized."""
    make = load_factory(path, sha256, name, factory, shown)
    try:
        net = make(classes, tuple(input_shape))
    except (Exception, SystemExit) as exc:
        raise CodeError(f"arch {name}: factory {factory} raised {typed_line(exc, 300)}") from None
    if not isinstance(net, gluon.HybridBlock):
        raise CodeError(f"arch {name}: factory {factory} returned {type(net).__name__}, not a gluon "
                        "HybridBlock")
    return net


def check_output(net: gluon.HybridBlock, name: str, classes: int, input_shape: tuple[int, ...],
                 ctx: mx.Context, dtype: str = "float32") -> tuple[int, ...]:
    """Forward TRIAL_SAMPLES random samples through an initialized net: its output shape, or
    CodeError unless it is (N, classes)."""
    batch = (TRIAL_SAMPLES, *input_shape)
    # NumPy's own generator: MXNet's seeded one (dropout, a training's) is left as it was
    x = mx.nd.array(np.random.default_rng(0).random(batch), ctx=ctx, dtype=dtype)
    try:
        shape = tuple(int(d) for d in net(x).shape)
    except (Exception, SystemExit) as exc:
        raise CodeError(f"arch {name}: forward of a {batch} batch raised {typed_line(exc, 300)}") from None
    if shape != (TRIAL_SAMPLES, classes):
        raise CodeError(f"arch {name}: output shape {shape} does not match {classes} classes "
                        f"(expected {(TRIAL_SAMPLES, classes)} for a batch of {batch})")
    return shape


def trial(path: Path, sha256: str, name: str, factory: str, shown: str, classes: int,
          input_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Build, initialize (Xavier, seed 0) and forward on the CPU: the output shape."""
    net = build(path, sha256, name, factory, shown, classes, input_shape)
    mx.random.seed(0)
    try:
        net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    except (Exception, SystemExit) as exc:
        raise CodeError(f"arch {name}: initializing the net raised {typed_line(exc, 300)}") from None
    return check_output(net, name, classes, input_shape, mx.cpu())


def main(argv: list[str]) -> int:
    """`python -m mxq.tasks.model_store.user_code REPORT FILE SHA256 NAME FACTORY SHOWN CLASSES
    SHAPE`: the trial; its verdict goes to REPORT as JSON ({"output_shape"} or {"error"})."""
    report, path, sha256, name, factory, shown, classes, shape = argv
    input_shape = tuple(int(d) for d in shape.split(","))
    try:
        out = trial(Path(path), sha256, name, factory, shown, int(classes), input_shape)
    except CodeError as exc:
        Path(report).write_text(json.dumps({"error": str(exc)}))
        return TRIAL_INPUT_ERROR
    Path(report).write_text(json.dumps({"output_shape": list(out)}))
    print(f"arch {name}: {factory}({classes}, {input_shape}) gives {out} for a batch of "
          f"{TRIAL_SAMPLES}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
