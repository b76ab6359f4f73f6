"""What a finished training registers: its version, for a scheduled retraining promoted or
not by the schedule's policy (the promoted version judged again on the same validation split,
`rejudge`), and its int8/fp16 variants from the job's calibration sample."""

from __future__ import annotations

import sys
from dataclasses import replace

from mxq.db import registry, schedules
from mxq.db.fence import Fence, Superseded
from mxq.db.records import ModelRecord
from mxq.errors import MxqError
from mxq.objects import ObjectURLError
from mxq.preprocess import Preprocess
from mxq.tasks.inference.inputs import InputError
from mxq.tasks.job_context import JobLost
from mxq.tasks.model_store.models import load
from mxq.tasks.model_store.mxnet.files import input_dtype
from mxq.tasks.model_store.mxnet.versions import add_trained
from mxq.tasks.model_store.variants import Calibration, build_variant
from mxq.tasks.runtimes.mx import gluon, mx
from mxq.tasks.training import calibration
from mxq.tasks.training.train_loop import accuracy
from mxq.tasks.training.training_data import Data
from mxq.workers.jobs.jobspecs import TrainParams
from mxq.workers.paths import PathError
from mxq.workers.settings import Settings
from mxq.workers.storage.client import StorageError


def register(s: Settings, p: TrainParams, fence: Fence, net: gluon.HybridBlock, data: Data,
              metrics: dict[str, float | None], ctx: mx.Context) -> dict[str, object]:
    """Register the trained version (and, for a scheduled retraining, promote it or not)."""
    owner = p.dist.parent if p.dist is not None else fence.job_id
    try:
        model = add_trained(s, p.name, net, data.version, metrics, owner, fence)
    except Superseded as exc:
        raise JobLost(str(exc)) from None
    promotion = None
    if p.fire_id is not None:  # a scheduled retraining: promote by the schedule's policy
        promotion = schedules.decide_promotion(s.database, p.fire_id, p.name, model["version"],
                                               metrics, rejudge(s, p, data, ctx))
    done: dict[str, object] = {"model_version": model["version"], "promotion": promotion}
    if p.calibration is not None and (promotion is None or promotion["decision"] == "promoted"):
        built = _variants(s, p, model)
        done |= {"variant": built[0], "variants": built}
    return done


def rejudge(s: Settings, p: TrainParams, data: Data, ctx: mx.Context
            ) -> tuple[int, dict[str, float]] | None:
    """The promoted version of `p.name` and its val_accuracy on this training's validation split,
    its inputs scaled as it serves them: what a fair `if-better` compares the new version with.
    None (its registered figure stands) without a validation split, a promoted version, or one
    that takes these samples."""
    if data.val_raw is None:
        return None
    promoted = next((m for m in registry.list_models(s.database, p.name) if m["promoted"]), None)
    if promoted is None or tuple(promoted["input_shape"]) != data.val_raw.sample_shape:
        return None
    try:
        net, _ = load(s, promoted, ctx)
    except MxqError as exc:  # its files gone or changed: it cannot be measured again
        print(f"mxq: {promoted['name']}:{promoted['version']} not measured again: {exc}", file=sys.stderr)
        return None
    val = replace(data.val_raw, x=Preprocess.from_dict(promoted["preprocess"]).apply(data.val_raw.x))
    return promoted["version"], {"val_accuracy": accuracy(net, val, ctx, p.batch_size, input_dtype(net))}


VARIANT_ERRORS = (MxqError, InputError, PathError, ObjectURLError, StorageError)


def _variants(s: Settings, p: TrainParams, model: ModelRecord) -> list[dict[str, object]]:
    """The trained version's variants (`p.variants`), built from the job's calibration sample,
    each in brief; or why it could not be (the training succeeded: the version serves in float32)."""
    assert p.calibration is not None
    try:
        data = calibration.load(s, p.calibration, model)
    except VARIANT_ERRORS as exc:
        return [{"precision": precision, "error": str(exc)} for precision in p.variants]
    return [_variant(s, p, model, data, precision) for precision in p.variants]


def _variant(s: Settings, p: TrainParams, model: ModelRecord, data: Calibration,
             precision: str) -> dict[str, object]:
    try:
        built = build_variant(s, model, precision, data, bound=p.min_agreement)["variants"][precision]
    except VARIANT_ERRORS as exc:
        return {"precision": precision, "error": str(exc)}
    return {"precision": precision, "agreement": built["agreement"], "max_diff": built["max_diff"],
            "accuracy": built["accuracy"], "bound": built["bound"]}
