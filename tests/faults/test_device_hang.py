"""A hung device is noticed (issue 60, item 3), with real workers: a GPU cannot exist here, so a
`sitecustomize` makes one CPU worker's forward pass block, as a hung GPU's call never returns,
while a flag file exists; and makes that device's start check block too, as a hung GPU's would.

Without the watchdog the job stayed `running` on the blocked worker until MXQ_STALL_SECONDS (an
hour) and then failed as the job's own failure; the worker's start check had no time bound."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mxq.db.events import list_events
from mxq.db.webhooks import endpoints, outbox
from mxq.json_types import JsonObject
from mxq.workers.fleet.device_table import device_table
from mxq.workers.hardware.pinning import REFUSAL_PREFIX
from tests.conftest import NODE, Stack, launch, stop, wait_until
from tests.faults.test_device_fault import mlp_and_input, stored_rows

pytestmark = pytest.mark.slow

SAMPLES, BATCH = 120_000, 128
HANG_AFTER = 200  # forward passes of the first worker to reach it before its "GPU" hangs
HANG_SECONDS, START_CHECK_SECONDS = 5, 2

# Loaded by every Python process of the stack that has PYTHONPATH; acts only in a device worker
# while the marker file exists. The first worker to reach HANG_AFTER takes the marker (an atomic
# rename to `hang.cpuN`); from then on its forward pass, and its device's start check in the
# workers that replace it, block while that file exists.
SITECUSTOMIZE = '''
import os
import time
marker = os.environ.get("MXQ_TEST_HANG_MARKER", "")
device = os.environ.get("MXQ_DEVICE", "")
if marker and device:
    from mxq.tasks.model_store import models
    from mxq.tasks.runtimes import mx_context

    hung = marker + "." + device.replace(":", "")
    real_forward, real_check, calls = models.probabilities, mx_context.check_visible, [0]

    def block():
        while os.path.exists(hung):
            time.sleep(0.05)

    def probabilities(*args, **kwargs):
        calls[0] += 1
        if calls[0] == HANG_AFTER:
            try:
                os.rename(marker, hung)
            except OSError:
                pass  # another worker hung
            block()
        return real_forward(*args, **kwargs)

    def check_visible(*args, **kwargs):
        block()
        return real_check(*args, **kwargs)

    models.probabilities = probabilities
    mx_context.check_visible = check_visible
'''


def _hanging_environment(tmp: Path) -> dict[str, str]:
    (tmp / "site").mkdir()
    (tmp / "site" / "sitecustomize.py").write_text(f"HANG_AFTER = {HANG_AFTER}\n" + SITECUSTOMIZE)
    marker = tmp / "hang"
    marker.write_text("the first worker to reach HANG_AFTER hangs")
    return {"PYTHONPATH": str(tmp / "site"), "MXQ_TEST_HANG_MARKER": str(marker),
            "MXQ_DEVICE_HANG_SECONDS": str(HANG_SECONDS),
            "MXQ_START_CHECK_SECONDS": str(START_CHECK_SECONDS), "MXQ_REPROBE_SECONDS": "2"}


def _row(stack: Stack, device: str) -> JsonObject:
    return next(r for r in device_table(stack.settings) if r["device"] == device)


@pytest.mark.timeout(600)
def test_a_hung_device_is_taken_out_its_job_requeued_and_its_hung_start_check_refused(
        isolated: Stack, tmp_path: Path) -> None:
    url = isolated.settings.database
    hook = endpoints.add_hook(url, "https://hooks.example.com/in", ["device.out"], "admin")["id"]
    launcher = launch(isolated, **_hanging_environment(tmp_path))
    try:
        mlp_and_input(isolated, "hang.npy", 7, SAMPLES)
        # On cpu:0 only: the job, queued again, waits for that device to come back.
        sent = isolated.mxq_json("infer", "mlp64", "hang.npy", "--device", "cpu:0", "--engine",
                                 "mxnet", "--precision", "fp32", "--batch-size", str(BATCH))
        job_id = sent["id"]
        flag = tmp_path / "hang.cpu0"
        wait_until(flag.exists, 120, "cpu:0's forward pass to hang")

        requeued = isolated.wait(job_id, timeout=60, until=("queued",))
        assert requeued["device_faults"] == 1 and requeued["attempts"] == 1, requeued
        said = [e["message"] for e in list_events(url, job_id) if e["kind"] == "device-fault"]
        assert len(said) == 1, said
        assert said[0].startswith(f"device fault on cpu:0 during job {job_id}: no batch finished "
                                  "on cpu:0 for "), said
        assert f"(MXQ_DEVICE_HANG_SECONDS {HANG_SECONDS}, 10 times its slowest batch" in said[0]
        assert "the device is taken out as hung" in said[0]

        # Its replacement's start check hangs too: refused within its bound, the device out.
        out = wait_until(lambda: _row(isolated, "cpu:0"), 120, "cpu:0's hung start check",
                         until=lambda r: "start check" in str(r.get("out_reason")), interval=0.5)
        assert out["health"] == "out"
        assert out["out_reason"] == (f"worker for cpu:0: its start check did not finish in "
                                     f"{START_CHECK_SECONDS} s (MXQ_START_CHECK_SECONDS): the device "
                                     "is taken for hung"), out
        assert isolated.job(job_id)["status"] == "queued"
        log = (isolated.home / "logs" / f"cpu0-{NODE}.log").read_text(errors="replace")
        assert f"{REFUSAL_PREFIX}device fault on cpu:0 during job {job_id}: no batch finished" in log
        told = [d["payload"]["device"] for d in outbox.list_deliveries(url, hook)
                if d["event"] == "device.out"]
        assert len(told) == 1 and told[0]["device"] == "cpu:0", told
        assert "no batch finished on cpu:0" in told[0]["reason"], told

        flag.unlink()  # the GPU healed: the next probe passes and the job resumes there
        job = isolated.wait(job_id, timeout=300)
        assert job["status"] == "succeeded", job["error"]
        assert (job["device"], job["device_faults"], job["attempts"]) == ("cpu:0", 1, 1), job
        assert np.array_equal(stored_rows(isolated, job_id), np.arange(SAMPLES)), \
            "a row lost or stored twice"
        assert _row(isolated, "cpu:0")["health"] == "healthy"
    finally:
        stop(launcher)
