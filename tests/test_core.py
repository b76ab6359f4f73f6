"""The package's own modules (core/): the Device type, and the pure rules (promotion, epoch
merge, how a job made of parts ends).

No database and no broker: each rule is driven with values, as `mxq.db` hands them over.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from mxq import parts, priorities, promotion, shares
from mxq.device import Device
from mxq.promotion import PromotionPolicy
from mxq.since import DurationError, SinceError, format_duration, parse_duration, parse_since
from mxq.status import AfterVerdict, JobStatus, after_verdict

if TYPE_CHECKING:
    from mxq.errors import MxqError

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


def test_device_labels_parse_once_and_sort_by_index() -> None:
    assert Device.parse(" GPU:3 ") == Device("gpu", 3)
    on_node = Device.parse("cpu:0@node-b")
    assert (on_node.kind, on_node.index, on_node.node, on_node.label) == ("cpu", 0, "node-b", "cpu:0")
    assert str(on_node) == "cpu:0@node-b" and str(Device("gpu", 1)) == "gpu:1"
    assert sorted(map(Device.parse, ["cpu:10", "cpu:2", "gpu:0"])) == [
        Device("cpu", 2), Device("cpu", 10), Device("gpu", 0)]
    assert Device.parse("gpu:0").is_gpu and not Device.parse("cpu:0").is_gpu


@pytest.mark.parametrize("text", ["gpu", "gpu:-1", "tpu:0", "gpu:0@", "gpu:0@a@b", "gpu:1x", "", "auto"])
def test_a_bad_device_label_says_what_is_allowed(text: str) -> None:
    with pytest.raises(ValueError, match="expected gpu:N or cpu:N") as err:
        Device.parse(text)
    assert repr(text) in str(err.value)


@pytest.mark.parametrize(("policy", "new", "old", "has_old", "promoted", "reason"), [
    ("never", 0.99, 0.1, True, False, "policy is never"),
    ("always", 0.1, 0.99, True, True, "policy is always"),
    ("if-better", None, 0.5, True, False, "the new version has no val_accuracy"),
    ("if-better", 0.5, None, False, True, "no promoted version to compare with"),
    ("if-better", 0.5, None, True, True, "no promoted version to compare with"),  # it has no metric
    ("if-better", 0.93, 0.90, True, True, "val_accuracy 0.9300 >= 0.9000 + min gain 0.02"),
    ("if-better", 0.91, 0.90, True, False, "val_accuracy 0.9100 < 0.9000 + min gain 0.02"),
])
def test_promotion_by_policy(policy: str, new: float | None, old: float | None, has_old: bool,
                             promoted: bool, reason: str) -> None:
    rule = PromotionPolicy(policy, "val_accuracy", 0.02)
    decision = promotion.decide(rule, new, old, has_current=has_old)
    assert (decision.promoted, decision.reason) == (promoted, reason)
    record = promotion.decision_record(decision, rule, 7, new, 6 if has_old else None, old)
    assert record["decision"] == ("promoted" if promoted else "kept")
    assert (record["new_version"], record["promoted_version"]) == (7, 6 if has_old else None)


@pytest.mark.parametrize(("policy", "new", "old", "has_old", "promoted", "reason"), [
    ("if-better", 0.084, None, False, False, "val_accuracy 0.0840 is below the floor 0.9 (--min-metric)"),
    ("always", 0.5, 0.99, True, False, "val_accuracy 0.5000 is below the floor 0.9 (--min-metric)"),
    ("if-better", None, None, False, False, "val_accuracy none is below the floor 0.9 (--min-metric)"),
    ("never", 0.99, None, False, False, "policy is never"),
    ("if-better", 0.95, None, False, True, "no promoted version to compare with"),
    ("always", 0.9, 0.99, True, True, "policy is always"),  # at the floor is not below it
])
def test_a_promotion_floor_keeps_a_version_below_it_whatever_the_policy(
        policy: str, new: float | None, old: float | None, has_old: bool, promoted: bool,
        reason: str) -> None:
    """A retraining fed the wrong data (val_accuracy 0.084) was promoted by `if-better` when no
    version was promoted yet; with a floor it is registered and kept."""
    decision = promotion.decide(PromotionPolicy(policy, "val_accuracy", 0.0, min_metric=0.9), new,
                                old, has_current=has_old)
    assert (decision.promoted, decision.reason) == (promoted, reason)


def epoch_row(train_loss: float, train_accuracy: float, val_accuracy: float | None, seconds: float,
             samples_per_sec: float, per_device: dict[str, Any] | None,
             checkpoint: str | None = None) -> parts.EpochFigures:
    """One part's epoch as `mxq.db` reads it (an Epoch row has these attributes)."""
    return SimpleNamespace(train_loss=train_loss, train_accuracy=train_accuracy,
                           val_accuracy=val_accuracy, seconds=seconds, samples_per_sec=samples_per_sec,
                           per_device=per_device, checkpoint=checkpoint)


def test_epoch_merge_means_accuracy_and_sums_rate() -> None:
    a = epoch_row(0.4, 0.8, 0.7, 10.0, 100.0, {"cpu:0@a": 50.0, "cpu:1@a": 50.0}, "ck/a")
    b = epoch_row(0.2, 0.6, None, 12.0, 80.0, {"cpu:0@b": 80.0})
    merged = parts.merge_epochs(3, [a, b])
    assert merged["epoch"] == 3
    assert merged["train_loss"] == pytest.approx(0.3) and merged["train_accuracy"] == pytest.approx(0.7)
    assert merged["val_accuracy"] == pytest.approx(0.7)  # a part without validation does not count
    assert merged["seconds"] == 12.0 and merged["samples_per_sec"] == 180.0
    assert set(merged["per_device"]) == {"cpu:0@a", "cpu:1@a", "cpu:0@b"}
    assert merged["checkpoint"] == "ck/a"


def test_only_epochs_every_part_finished_are_merged_once() -> None:
    row = epoch_row(0.1, 0.9, 0.9, 1.0, 1.0, None)
    by_epoch = {0: [row, row], 1: [row, row], 2: [row]}
    assert parts.epochs_ready(by_epoch, parts=2, merged={0}) == [1]
    assert parts.epochs_ready(by_epoch, parts=2, merged=set()) == [0, 1]


@dataclass
class PartRow:
    id: int
    chunk_index: int
    status: str = JobStatus.SUCCEEDED
    error: str | None = None
    node: str | None = "a"
    params: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] | None = None
    samples: int | None = 100
    seconds: float | None = 10.0
    samples_per_sec: float | None = 10.0
    started_at: datetime | None = T0
    finished_at: datetime | None = T0 + timedelta(seconds=10)


def test_chunks_that_all_succeeded_sum_samples_over_the_wall_clock_span() -> None:
    late = PartRow(2, 1, started_at=T0 + timedelta(seconds=5), finished_at=T0 + timedelta(seconds=20))
    values = parts.settle("infer", [PartRow(1, 0), late], T0 + timedelta(seconds=30))
    assert values["status"] == JobStatus.SUCCEEDED and values["progress"] == 1.0
    assert values["samples"] == 200 and values["seconds"] == 20.0 and values["samples_per_sec"] == 10.0


def test_a_split_inference_names_the_output_its_chunks_wrote() -> None:
    """The parent's record names the one file its chunks merged into (it said null)."""
    shared = {"output": "s3://team-data/out/ab12/job-7.parquet"}
    values = parts.settle("infer", [PartRow(8, 0, result=shared), PartRow(9, 1, result=shared)], T0)
    assert values["result"] == {**shared, "chunks": 2}
    apart = [PartRow(8, 0, result=shared), PartRow(9, 1, result={"output": "elsewhere"})]
    assert "result" not in parts.settle("infer", apart, T0)


def test_naive_datetimes_are_read_as_utc() -> None:
    naive = PartRow(1, 0, started_at=T0.replace(tzinfo=None), finished_at=None)
    assert parts.settle("infer", [naive], T0 + timedelta(seconds=4))["seconds"] == 4.0


def test_a_cancelled_chunk_cancels_the_parent_and_a_failed_one_fails_it() -> None:
    failed = PartRow(8, 1, status=JobStatus.FAILED, error="bad row 7")
    cancelled = PartRow(9, 2, status=JobStatus.CANCELLED)
    assert parts.settle("infer", [PartRow(1, 0), failed, cancelled], T0)["status"] == JobStatus.CANCELLED
    values = parts.settle("infer", [PartRow(1, 0), failed], T0)
    assert values["status"] == JobStatus.FAILED
    assert values["error"] == "chunk 1 (job 8) failed: bad row 7"


def test_a_multinode_failure_names_the_part_that_failed_of_its_own_accord() -> None:
    knocked = PartRow(5, 0, status=JobStatus.FAILED, node="a", finished_at=T0,
                      error=parts.knock_on("part 1 on node b (job 6) failed: out of memory"))
    cause = PartRow(6, 1, status=JobStatus.FAILED, node="b", finished_at=T0 + timedelta(seconds=1),
                    error="out of memory", params={"dist": {"node": "b"}})
    values = parts.settle("train", [knocked, cause], T0 + timedelta(seconds=2))
    assert values["error"] == "part 1 on node b (job 6) failed: out of memory"
    assert parts.first_cause([knocked, cause], T0) is cause


def test_a_multinode_training_sums_rate_and_keeps_rank0s_model() -> None:
    rank0 = PartRow(5, 0, node="a", samples_per_sec=300.0, seconds=9.0,
                    result={"rank": 0, "model": "m", "model_version": 3, "per_device": {"cpu:0@a": 300.0}})
    rank1 = PartRow(6, 1, node="b", samples_per_sec=200.0, seconds=11.0,
                    result={"rank": 1, "model": "m", "model_version": None, "per_device": {"cpu:0@b": 200.0}})
    values = parts.settle("train", [rank1, rank0], T0 + timedelta(seconds=20))
    assert values["samples_per_sec"] == 500.0 and values["seconds"] == 11.0
    result = values["result"]
    assert result["model_version"] == 3 and result["nodes"] == 2
    assert result["devices"] == ["cpu:0@b", "cpu:0@a"]
    assert result["per_node"]["b"]["rank"] == 1 and result["per_node"]["a"]["job_id"] == 5


def _subclasses(cls: type[MxqError]) -> set[type[MxqError]]:
    return {c for sub in cls.__subclasses__() for c in {sub, *_subclasses(sub)}}


def test_every_expected_failure_has_one_status_and_one_exit_code() -> None:
    """Each error class of every layer maps to an HTTP status and an exit status through the
    hierarchy alone: a new error class needs no entry in a list."""
    import importlib
    import pkgutil

    import mxq
    from mxq.api.app import status_of
    from mxq.cli.errors import EXIT_JOB_FAILED, EXIT_USAGE, describe, exit_code
    from mxq.errors import JobRejected, MxqError

    for layer in ("db", "workers", "tasks", "api", "cli", "client"):
        package = importlib.import_module(f"mxq.{layer}")
        for info in pkgutil.walk_packages(package.__path__, f"mxq.{layer}."):
            if ".migrations" not in info.name and not info.name.endswith((".__main__", ".celery")):
                importlib.import_module(info.name)
    found = _subclasses(MxqError)
    names = {c.__name__ for c in found}
    assert {"ParamsError", "ModelNotFound", "ScheduleExists", "SubmitError", "ModelError",
            "ArchError", "InputError", "JobNotFound"} <= names, names
    for cls in found:
        exc = cls(7, "bad") if issubclass(cls, JobRejected) else cls("bad thing")
        assert status_of(exc) in (401, 403, 404, 409, 422, 503), cls
        assert describe(exc) == str(exc)
        assert exit_code(exc) == (EXIT_JOB_FAILED if cls is JobRejected else EXIT_USAGE)
    assert mxq.__file__ is not None


AGREES = {"file": "m.onnx", "max_diff": 3e-8, "argmax_agreement": 1.0}


@pytest.mark.parametrize(("asked", "onnx", "speeds", "engine", "reason"), [
    ("mxnet", AGREES, {"onnx": 9.0, "mxnet": 1.0}, "mxnet", "asked"),
    ("onnx", None, None, "onnx", "asked"),  # the task refuses it if there is no export
    ("auto", AGREES, {"onnx": 9.0, "mxnet": 1.0}, "onnx", "measured faster: onnx 9 vs mxnet 1 samples/s"),
    ("auto", AGREES, {"onnx": 1.0, "mxnet": 9.0}, "mxnet", "measured faster: onnx 1 vs mxnet 9 samples/s"),
    ("auto", AGREES, {"onnx": 5.0, "mxnet": 5.0}, "mxnet", "measured faster: onnx 5 vs mxnet 5 samples/s"),
    ("auto", {"file": None, "error": "erfinv"}, None, "mxnet", "no ONNX export (erfinv)"),
    ("auto", {**AGREES, "max_diff": 2e-3}, {"onnx": 9.0, "mxnet": 1.0}, "mxnet",
     "ONNX disagrees with MXNet (max diff 0.002, argmax agreement 100.00%; allowed 0.0001 and 100%)"),
    ("auto", {**AGREES, "argmax_agreement": 0.9375}, {"onnx": 9.0}, "mxnet",
     "ONNX disagrees with MXNet (max diff 3e-08, argmax agreement 93.75%; allowed 0.0001 and 100%)"),
])
def test_the_engine_a_job_gets(asked: str, onnx: dict | None, speeds: dict | None, engine: str,
                               reason: str) -> None:
    from mxq import engines

    assert engines.choose(asked, onnx, speeds) == engines.Choice(engine, reason)


def test_auto_measures_only_an_agreeing_export_without_figures() -> None:
    from mxq.engines import needs_measuring

    assert needs_measuring("auto", AGREES, None) and needs_measuring("auto", AGREES, {})
    assert not needs_measuring("auto", AGREES, {"onnx": 1.0, "mxnet": 2.0})
    assert not needs_measuring("mxnet", AGREES, None) and not needs_measuring("onnx", AGREES, None)
    assert not needs_measuring("auto", {"file": None, "error": "x"}, None)


def test_a_device_mxnet_cannot_run_gets_onnx_or_a_reason() -> None:
    from mxq.engines import Choice, NoEngine, choose

    why = "gpu:0 (NVIDIA H200, compute capability 9.0 = sm_90) cannot run the installed mxnet-cu112"
    assert choose("auto", AGREES, None, why) == Choice("onnx", "MXNet cannot run this device")
    assert choose("onnx", {**AGREES, "max_diff": 0.5}, None, why) == Choice("onnx", "asked")
    with pytest.raises(NoEngine, match=r"^--engine mxnet cannot run here: gpu:0 \(NVIDIA H200"):
        choose("mxnet", AGREES, None, why)
    with pytest.raises(NoEngine, match=r"ONNX disagrees .*pass --engine onnx to run the ONNX export"):
        choose("auto", {**AGREES, "max_diff": 0.5}, None, why)
    with pytest.raises(NoEngine, match=r"^no ONNX export \(erfinv\), and MXNet cannot run this device"):
        choose("auto", {"file": None, "error": "erfinv"}, None, why)


def test_since_is_an_age_or_an_iso_time() -> None:
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    assert parse_since("2h", now) == now - timedelta(hours=2)
    assert parse_since(" 45s", now) == now - timedelta(seconds=45)
    assert parse_since("2026-11-30T08:00", now) == datetime(2026, 11, 30, 8, tzinfo=UTC)
    assert parse_since("2026-11-30T08:00+01:00", now).utcoffset() == timedelta(hours=1)
    for bad in ("yesterday", "2x", "-1h", "999999999d"):
        with pytest.raises(SinceError, match=r"since .*"):
            parse_since(bad, now)


def test_a_duration_is_whole_seconds_or_amounts_of_d_h_m_s() -> None:
    assert [parse_duration(t) for t in ("90", "90s", "45m", "2h", "1h30m", "1d12h", "1h0m5s")] == \
        [90, 90, 2700, 7200, 5400, 129600, 3605]
    for bad in ("5x", "", "1.5h", "30m2h", "1h1h", "-5", "h", "90 s", " 90s", "2H", "90s\n", "١٢"):
        with pytest.raises(DurationError) as caught:
            parse_duration(bad, "--time-limit")
        assert str(caught.value) == f"--time-limit {bad!r}: expected a duration such as 90s, 45m, " \
            "2h or 1h30m (or whole seconds)"
    assert [format_duration(s) for s in (90, 7200, 5400, 1, 86400 + 61)] == \
        ["1m30s", "2h", "1h30m", "1s", "1d1m1s"]
    assert all(parse_duration(format_duration(s)) == s for s in (1, 59, 61, 3599, 3601, 2592000))


def test_a_time_limit_is_what_the_schema_pattern_allows_and_always_within_its_bound() -> None:
    """The API's schema states time_limit exactly (issue 58: "0" was schema-valid, then refused):
    what the pattern allows parses within 1..MAX_TIME_LIMIT, and what it does not is refused."""
    from mxq.since import MAX_TIME_LIMIT, TIME_LIMIT_PATTERN, parse_time_limit

    largest = ("999999999", "9999d9999h9999m9999s", "9999d")
    assert all(1 <= parse_time_limit(t) <= MAX_TIME_LIMIT for t in largest + ("1", "1s", "0d1s"))
    assert parse_time_limit("999999999") == MAX_TIME_LIMIT
    for bad in ("0", "0s", "0d0h0m0s", "", "10000d", "1000000000", "5x", "30m2h"):
        assert re.fullmatch(TIME_LIMIT_PATTERN, bad) is None
        with pytest.raises(DurationError, match=r"^--time-limit '.*': expected a duration of at least 1s"):
            parse_time_limit(bad, "--time-limit")


def test_an_error_says_what_happened_first_for_a_driver_and_last_for_mxnet() -> None:
    """`first_line` for libraries that say what happened first and add SQL, hints or a help link
    below (SQLAlchemy, psycopg, redis); `reason` for MXNet, whose traceback comes first."""
    from mxq.errors import first_line, reason

    driver = ValueError("(psycopg.OperationalError) connection refused\n[SQL: SELECT 1]\n"
                        "(Background on this error at: https://sqlalche.me/e/20/e3q8)")
    assert first_line(driver) == "(psycopg.OperationalError) connection refused"
    assert reason(driver).startswith("(Background on this error")  # why drivers need first_line
    mxnet = RuntimeError('Traceback (most recent call last):\n  File "x.py", line 1\n'
                         "[bt] (0) libmxnet.so\nMXNetError: out of memory")
    assert reason(mxnet) == "MXNetError: out of memory" and first_line(mxnet).startswith("Traceback")
    assert first_line(RuntimeError("  \n")) == "RuntimeError"
    assert first_line(ValueError("x" * 400)) == "x" * 300
    assert first_line(ValueError("x" * 400), 20) == "x" * 20


def test_typed_line_names_the_type_of_an_unexpected_failure() -> None:
    from mxq.errors import typed_line

    assert typed_line(KeyError("samples")) == "KeyError: 'samples'"
    assert typed_line(RuntimeError("disk full\n  at line 3")) == "RuntimeError: disk full"
    assert typed_line(RuntimeError("")) == "RuntimeError"
    assert typed_line(ValueError("x" * 600)) == "ValueError: " + "x" * 500


def _running(job_id: int, level: str, device: str, minutes_ago: int, **kw: Any) -> priorities.Running:
    return priorities.Running(id=job_id, level=level, preemptible=kw.pop("preemptible", level == "low"),
                              devices=frozenset({device}),
                              started_at=datetime(2026, 1, 1, tzinfo=UTC) - timedelta(minutes=minutes_ago),
                              **kw)


def test_a_waiting_job_preempts_the_lowest_level_newest_job_on_a_device_it_could_use() -> None:
    waiting = priorities.Waiting(9, "high", frozenset({"n/cpu:0", "n/cpu:1"}))
    running = [_running(1, "normal", "n/cpu:0", 5, preemptible=True),
               _running(2, "low", "n/cpu:1", 10), _running(3, "low", "n/cpu:2", 1)]
    assert priorities.victim(waiting, running) == 2  # cpu:2 is not one it could use
    assert priorities.victim(waiting, running[:2] + [_running(4, "low", "n/cpu:0", 1)]) == 4


def test_no_preemption_while_a_device_is_free_or_none_may_yield() -> None:
    waiting = priorities.Waiting(9, "high", frozenset({"n/cpu:0", "n/cpu:1"}))
    assert priorities.victim(waiting, [_running(2, "low", "n/cpu:1", 1)]) is None  # cpu:0 is free
    assert priorities.victim(waiting, [_running(1, "high", "n/cpu:0", 1, preemptible=True),
                                       _running(2, "normal", "n/cpu:1", 1)]) is None
    normal = priorities.Waiting(9, "normal", frozenset({"n/cpu:0"}))
    assert priorities.victim(normal, [_running(1, "normal", "n/cpu:0", 1, preemptible=True)]) is None


def test_no_job_is_preempted_twice_by_one_job_nor_past_the_limit_nor_asked_twice() -> None:
    waiting = priorities.Waiting(9, "high", frozenset({"n/cpu:0"}))
    assert priorities.victim(waiting, [_running(1, "low", "n/cpu:0", 1, preempted_by=(9,))]) is None
    spent = _running(1, "low", "n/cpu:0", 1, preemptions=priorities.MAX_PREEMPTIONS)
    assert priorities.victim(waiting, [spent]) is None
    assert priorities.victim(waiting, [_running(1, "low", "n/cpu:0", 1, yielding_to=9)]) is None
    training = priorities.Waiting(9, "high", frozenset({"n/cpu:0", "n/cpu:1"}), needs=2)
    assert priorities.victim(training, [_running(1, "low", "n/cpu:0", 1)]) == 1  # one free, two needed


@pytest.mark.parametrize(("level", "asked", "preemptible"), [
    (None, None, False), ("low", None, True), ("HIGH", True, True), ("low", False, False)])
def test_a_priority_is_parsed_and_preemptible_follows_the_level_unless_said(
        level: str | None, asked: bool | None, preemptible: bool) -> None:
    got = priorities.Priority.of(level, asked)
    assert got.preemptible is preemptible and got.level == (level or "normal").lower()


def test_an_unknown_priority_says_what_is_allowed() -> None:
    allowed = "priority 'urgent' is not allowed: use high, normal or low"
    with pytest.raises(priorities.PriorityError, match=allowed):
        priorities.Priority.of("urgent")


def _held(job_id: int, owner: str, level: str = "normal", needs: int = 1) -> shares.Held:
    return shares.Held(job_id, owner, level, needs)


def _next(held: list[shares.Held], weights: dict[str, shares.Share], usage: shares.Usage) -> int | None:
    chosen = shares.next_held(held, weights, usage)
    return None if chosen is None else chosen.id


def test_within_a_priority_the_owner_furthest_below_its_share_goes_first() -> None:
    weights = {"a": shares.Share(1.0), "b": shares.Share(3.0)}
    usage = shares.Usage({"a": 10.0, "b": 20.0}, {}, typical_seconds=5.0)
    assert _next([_held(1, "a"), _held(2, "b")], weights, usage) == 2  # 20/3 < 10/1
    usage.take(_held(2, "b"))  # b now holds a device, counted at a typical job's 5 s: 25/3 < 10
    assert _next([_held(1, "a"), _held(3, "b")], weights, usage) == 3
    usage.devices["b"] = 3  # 35/3 > 10
    assert _next([_held(1, "a"), _held(3, "b")], weights, usage) == 1
    assert _next([_held(1, "a"), _held(4, "b", "high")], weights, usage) == 4  # priority first


def test_a_job_beyond_its_owners_quota_stays_held_and_says_why() -> None:
    capped = {"a": shares.Share(1.0, max_devices=2)}
    usage = shares.Usage({}, {"a": 1})
    assert shares.next_held([_held(1, "a", needs=2)], capped, usage) is None
    assert _next([_held(1, "a", needs=2), _held(2, "c")], capped, usage) == 2  # c: no quota
    usage.take(_held(3, "a"))
    assert shares.over_quota(_held(5, "a"), capped["a"], usage)
    assert shares.quota_reason(capped["a"], 2) == "waiting: quota 2 devices, 2 in use"
    assert shares.quota_reason(shares.Share(max_devices=1), 1) == "waiting: quota 1 device, 1 in use"


def test_a_borrowed_device_is_taken_back_first_by_any_job_within_its_quota() -> None:
    low = priorities.Waiting(9, "low", frozenset({"n/cpu:0", "n/cpu:1"}))
    running = [_running(1, "low", "n/cpu:0", 5), _running(2, "high", "n/cpu:1", 1, borrowed=True)]
    assert priorities.victim(low, running) == 2  # a low job takes back a high job's borrowed device
    high = priorities.Waiting(9, "high", low.capable)
    assert priorities.victim(high, running) == 2  # borrowed before a lower level
    lent = priorities.Waiting(9, "normal", low.capable, borrowed=True)
    assert priorities.victim(lent, running) == 1  # a borrower takes no borrowed device back


def test_object_urls_are_parsed_and_confined_to_allowed_prefixes() -> None:
    from mxq.objects import Allowed, ObjectURLError, confined, parse

    url = parse("s3://team-data/scoring/2026/x.NPY")
    assert (url.bucket, url.key, url.suffix, str(url)) == ("team-data", "scoring/2026/x.NPY", ".npy",
                                                           "s3://team-data/scoring/2026/x.NPY")
    allowed = Allowed.parse(" team-data/scoring , s3://models ,")
    assert str(allowed) == "team-data/scoring, models"
    assert allowed.admits(url) and allowed.admits(parse("s3://models/any/thing"))
    assert not allowed.admits(parse("s3://team-data/scoring-old/x.npy"))  # a prefix is a folder
    assert not allowed.admits(parse("s3://team-data/x.npy"))
    assert not Allowed.parse(None).admits(url) and str(Allowed.parse("")) == "none"
    with pytest.raises(ObjectURLError, match=r"outside the allowed buckets and prefixes \(SETTING: none\)"):
        confined("s3://team-data/x.npy", Allowed(), "SETTING")
    for bad in ("s3://team-data/a//b", "s3://team-data/./b", "s3://team-data/a/\x00", "s3://x/k",
                "s3://team_data/k", "s3://-team/k", "/local/path", "s3://team-data/"):
        with pytest.raises(ObjectURLError):
            parse(bad)
    with pytest.raises(ObjectURLError, match="is not a bucket name"):
        Allowed.parse("Team/x")


def test_a_job_out_of_host_memory_says_so_and_where() -> None:
    """Python raises a bare MemoryError wherever an allocation fails (a 1 MiB read, say): the
    failed job names it and its devices, not a class name alone."""
    from mxq.tasks.job_context import JobContext
    from mxq.tasks.runner import _unexpected
    from mxq.workers.settings import Settings

    job = JobContext(7, "infer", {}, "cpu:0", Settings(database_url="sqlite://"), "q", "cpu:0", None)
    assert _unexpected(job, MemoryError()) == "out of host memory on cpu:0"
    numpy_said = MemoryError("Unable to allocate 8.00 MiB for an array with shape (8192, 256)")
    assert _unexpected(job, numpy_said) == ("out of host memory on cpu:0: Unable to allocate 8.00 "
                                           "MiB for an array with shape (8192, 256)")
    job.devices = ["cpu:0", "cpu:1"]
    assert _unexpected(job, MemoryError()) == "out of host memory on cpu:0, cpu:1"
    assert _unexpected(job, KeyError("samples")) == "KeyError: 'samples'"


@pytest.mark.parametrize(("cell", "written"), [
    ("=1+1", "'=1+1"), ('=HYPERLINK("http://x","y")', '\'=HYPERLINK("http://x","y")'),
    ("+x", "'+x"), ("-x", "'-x"), ("@x", "'@x"), ("\tx", "'\tx"), ("\rx", "'\rx"),
    ("-0.5", "'-0.5"),  # text that looks like a number is still text
    ("mlp64", "mlp64"), ("a=b", "a=b"), ("", ""), (-0.5, -0.5), (-3, -3), (0, 0), (None, None),
])
def test_a_csv_cell_that_a_spreadsheet_would_run_is_written_as_text(cell: object, written: object) -> None:
    """OWASP's rule for CSV injection: a string starting with =, +, -, @, a tab or a carriage
    return gets a leading quote; a number, even a negative one, stays a number."""
    from mxq.names import csv_cell

    got = csv_cell(cell)
    assert got == written and type(got) is type(written)


def test_who_reads_and_manages_what_another_owns() -> None:
    """mxq.users: results are read by their owner, their team's members and admins; a model's
    versions are managed by its owner and team (role submit) and admins; nobody's is admins'."""
    from mxq.users import Role, may_manage_model, may_read

    ml = frozenset({"ml"})
    assert may_read(Role.READ, "alice", frozenset(), "alice", None)
    assert may_read(Role.READ, "carol", ml, "alice", "ml")
    assert not may_read(Role.SUBMIT, "bob", frozenset({"ops"}), "alice", "ml")
    assert not may_read(Role.SUBMIT, "bob", ml, "alice", None)
    assert not may_read(Role.SUBMIT, "bob", frozenset(), None, None)  # from before users
    assert may_read(Role.ADMIN, "root", frozenset(), "alice", None)
    assert may_manage_model(Role.SUBMIT, "carol", ml, "alice", "ml")
    assert not may_manage_model(Role.READ, "carol", ml, "alice", "ml")  # reads, never promotes
    assert not may_manage_model(Role.SUBMIT, "bob", frozenset(), "alice", "ml")
    assert not may_manage_model(Role.SUBMIT, "alice", ml, None, None)  # the admins' model
    assert may_manage_model(Role.ADMIN, "root", frozenset(), None, None)


def test_a_device_fault_is_the_cuda_stacks_error_but_not_running_out_of_memory() -> None:
    """A fault sends the job elsewhere and takes the device out; running out of memory is the
    job's own (a batch halved), and taken for a fault it took out device after device."""
    from mxq.errors import DeviceFault, device_fault

    assert device_fault(RuntimeError("Check failed: e == cudaSuccess (214 vs. 0) : CUDA: "
                                     "uncorrectable ECC error encountered"))
    assert device_fault(RuntimeError("[ONNXRuntimeError] : 1 : FAIL : CUDNN failure 4: "
                                     "CUDNN_STATUS_INTERNAL_ERROR"))
    assert device_fault(DeviceFault("the session has no CUDA provider"))
    for memory in ("cudaMalloc retry failed: out of memory", "CUDA: out of memory",
                   "CUDNN_STATUS_ALLOC_FAILED", "CUDA failure 2: out of memory"):
        assert not device_fault(RuntimeError(memory)), memory
    assert not device_fault(ValueError("params file does not match symbol"))
    # the model's, on any GPU (issue 60): an op without a GPU kernel, the application's Xids 13/31
    for model in ("Operator _contrib_box_nms is not implemented for GPU.",
                  "Check failed: e == cudaSuccess (700 vs. 0) : CUDA: an illegal memory access was "
                  "encountered", "CUDA error: misaligned address",
                  "CUDA error: device-side assert triggered"):
        assert not device_fault(RuntimeError(model)), model


def test_a_job_after_others_goes_waits_or_fails_by_their_outcomes() -> None:
    ok, running = ("succeeded", None), ("running", None)
    assert after_verdict([1, 2], {1: ok, 2: ok}).ready
    assert after_verdict([1, 2, 3], {1: ok, 2: running, 3: ("queued", None)}) == AfterVerdict(waits_for=2)
    # one that cannot succeed decides at once, even while another still runs
    assert after_verdict([1, 2], {1: running, 2: ("failed", "boom\ntraceback")}) == AfterVerdict(
        error="job 2 it waits for (--after) failed: boom")
    assert after_verdict([1], {1: ("cancelled", "cancelled")}).error == \
        "job 1 it waits for (--after) was cancelled"
    assert after_verdict([7], {}).error == "job 7 it waits for (--after) was removed"
    assert after_verdict([1], {1: ("failed", None)}).error == \
        "job 1 it waits for (--after) failed: no error recorded"
    long = after_verdict([1], {1: ("failed", "x" * 500)}).error or ""
    assert long.endswith("x…") and len(long) < 260
